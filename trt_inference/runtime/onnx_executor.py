"""Runs a bundle's ONNX graphs (the same graphs TensorRT builds from, Q/DQ included) with ONNX Runtime on CPU.

This is how CI and CPU hosts exercise the exact graphs of an engine bundle.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class OnnxRuntimeExecutor:
    name = "onnxruntime-cpu"

    def __init__(self, bundle_dir: Path, manifest: dict, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or max(1, (os.cpu_count() or 2))
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sessions = {}
        for graph, entry in manifest["graphs"].items():
            path = Path(bundle_dir) / entry["onnx"]
            self.sessions[graph] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        shapes = manifest["shapes"]
        self.layers, self.kv_heads, self.head_dim = shapes["layers"], shapes["kv_heads"], shapes["head_dim"]
        self.kv_input_names = [f"past_{kind}_{layer}" for layer in range(self.layers) for kind in ("key", "value")]

    def vision(self, pixel_values: np.ndarray) -> np.ndarray:
        return self.sessions["vision"].run(None, {"pixel_values": pixel_values.astype(np.float32)})[0]

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        return self.sessions["embed"].run(None, {"input_ids": input_ids.astype(np.int64)})[0]

    def new_sequence(self) -> OnnxSequence:
        return OnnxSequence(self)

    def close(self) -> None:
        self.sessions.clear()


class OnnxSequence:
    """One conversation's KV cache (host arrays); starts with the dead slot."""

    def __init__(self, executor: OnnxRuntimeExecutor) -> None:
        self.executor = executor
        self.kv: list[np.ndarray] | None = None

    def run(self, inputs_embeds, position_ids, full_mask, sliding_mask) -> np.ndarray:
        """Append the new tokens to the cache; return float32 logits of the last token, shape (batch, vocab)."""
        executor = self.executor
        batch = inputs_embeds.shape[0]
        if self.kv is None:
            empty = np.zeros((batch, executor.kv_heads, 1, executor.head_dim), dtype=np.float32)
            self.kv = [empty] * (2 * executor.layers)
        feeds = {
            "inputs_embeds": inputs_embeds.astype(np.float32),
            "position_ids": position_ids.astype(np.int64),
            "full_mask": full_mask,
            "sliding_mask": sliding_mask,
            **dict(zip(executor.kv_input_names, self.kv, strict=True)),
        }
        logits, *presents = executor.sessions["decoder"].run(None, feeds)
        self.kv = presents
        return logits[:, -1].astype(np.float32)

    def close(self) -> None:
        self.kv = None
