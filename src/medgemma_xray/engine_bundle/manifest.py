"""manifest.json of an engine bundle: what was built, from what, for which TensorRT and GPU, and how accurate.

Read before anything is deserialised; no torch here (the runtime imports it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
# 2: the decoder returns only the new tokens' KV rows and reads its past at a capacity (kv_layout.py). A format-1
# bundle's decoder returns the whole past every step, which this runtime no longer binds.
FORMAT_VERSION = 2
FORMAT_CHANGES = {1: "its decoder copies the whole KV past into its output at every step"}


class ManifestError(ValueError):
    """The bundle's manifest is missing, malformed, or does not match this host."""


def write_manifest(bundle_dir: Path, manifest: dict[str, Any]) -> Path:
    """Write manifest.json by rename, so a reader never sees half a manifest and a hard-linked copy stays as it was."""
    path = Path(bundle_dir) / MANIFEST_NAME
    temporary = path.with_name(f".{MANIFEST_NAME}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"format": FORMAT_VERSION, **manifest}, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)
    return path


def read_manifest(bundle_dir: Path) -> dict[str, Any]:
    path = Path(bundle_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{bundle_dir} is not an engine bundle (no {MANIFEST_NAME}). Build one with: "
            "python optimize_trt_engine.py --model_path MODEL --calib_images FILMS --output_path DIR"
        )
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc}); rebuild the bundle.") from exc
    if manifest.get("format") != FORMAT_VERSION:
        found = manifest.get("format")
        why = f" ({FORMAT_CHANGES[found]})" if found in FORMAT_CHANGES else ""
        raise ManifestError(
            f"{path}: bundle format {found} is not {FORMAT_VERSION}, the format this runtime serves{why}. Rebuild "
            f"the bundle with this version: {rebuild_command(manifest)}"
        )
    for key in ("model", "precision", "graphs", "shapes", "tokens", "tensorrt", "build"):
        if key not in manifest:
            raise ManifestError(f"{path}: manifest lacks '{key}'; rebuild the bundle.")
    return manifest


def rebuild_command(manifest: dict[str, Any]) -> str:
    """The commands that made this bundle, in order (a build, then perhaps --from_onnx), ready to run again."""
    build = manifest.get("build", {})
    commands = list(build.get("commands") or ([build["command"]] if build.get("command") else []))
    if not commands:
        return (
            "python optimize_trt_engine.py --model_path MODEL --calib_images FILMS "
            f"--precision {manifest.get('precision', 'int8')} --output_path DIR --overwrite"
        )
    if "--output_path" in commands[0] and "--overwrite" not in commands[0]:
        commands[0] += " --overwrite"
    return " && ".join(commands)


def check_tensorrt_version(manifest: dict[str, Any], runtime_version: str) -> None:
    """Plans only load in the TensorRT version that built them; say so before deserialising."""
    built = manifest["tensorrt"].get("version")
    if built != runtime_version:
        raise ManifestError(
            f"This engine bundle cannot run here: TensorRT version mismatch, engine built with "
            f"{manifest['tensorrt'].get('target')} {built}, this host has {runtime_version}. "
            f"Rebuild it on this host: {rebuild_command(manifest)}"
        )


def check_gpu(manifest: dict[str, Any], gpu_name: str, compute_capability: str) -> None:
    """Plans are specific to a GPU generation unless built hardware-compatible (Ampere+)."""
    built = manifest["tensorrt"]
    allowed = str(built.get("compute_capability") or "").split(",")
    portable = built.get("hardware_compatibility") == "AMPERE_PLUS" and float(compute_capability) >= 8.0
    if compute_capability not in allowed and f"SM{compute_capability.replace('.', '')}" not in allowed and not portable:
        raise ManifestError(
            f"This engine bundle cannot run here: GPU mismatch, engine built for compute capability "
            f"{built.get('compute_capability')} ({built.get('gpu_name')}), this host has {compute_capability} "
            f"({gpu_name}). Rebuild it on this host: {rebuild_command(manifest)}"
        )
