"""Names the engine build writes and the runtime reads: graph tensors and TensorRT targets.

One module owns them so that export, the builder's optimization profiles and both executors cannot drift apart.
"""

from __future__ import annotations

from typing import Any

KV_KINDS = ("key", "value")

# The build's --target names and the Python module that provides each.
TARGET_MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}


def past_name(kind: str, layer: int) -> str:
    """The decoder's KV input for one layer: past_key_3, past_value_3."""
    return f"past_{kind}_{layer}"


def present_name(kind: str, layer: int) -> str:
    """The decoder's KV output for one layer: present_key_3, present_value_3."""
    return f"present_{kind}_{layer}"


def kv_input_names(layers: int) -> list[str]:
    """Every past input, layer by layer, key before value (the order the exported graph declares them)."""
    return [past_name(kind, layer) for layer in range(layers) for kind in KV_KINDS]


def runtime_module(manifest: dict[str, Any]) -> str:
    """The TensorRT module that can deserialise this bundle's plans."""
    return TARGET_MODULES[manifest["tensorrt"].get("target") or "tensorrt"]
