"""manifest.json of an engine bundle: what was built, from what, for which TensorRT and GPU, and how accurate.

Read before anything is deserialised; no torch here (the runtime imports it).
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


class ManifestError(ValueError):
    """The bundle's manifest is missing, malformed, or does not match this host."""


def write_manifest(bundle_dir: Path, manifest: dict) -> Path:
    path = Path(bundle_dir) / MANIFEST_NAME
    path.write_text(json.dumps({"format": FORMAT_VERSION, **manifest}, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(bundle_dir: Path) -> dict:
    path = Path(bundle_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{bundle_dir} is not an engine bundle (no {MANIFEST_NAME}). Build one with: "
            "python optimize_trt_engine.py --model_path MODEL --calib_images FILMS --output_path DIR"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc}); rebuild the bundle.") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise ManifestError(f"{path}: manifest format {manifest.get('format')} is not {FORMAT_VERSION}; rebuild.")
    for key in ("model", "precision", "graphs", "shapes", "tokens", "tensorrt", "build"):
        if key not in manifest:
            raise ManifestError(f"{path}: manifest lacks '{key}'; rebuild the bundle.")
    return manifest


def rebuild_command(manifest: dict) -> str:
    build = manifest.get("build", {})
    return build.get("command") or (
        "python optimize_trt_engine.py --model_path MODEL --calib_images FILMS "
        f"--precision {manifest.get('precision', 'int8')} --output_path DIR"
    )


def check_engine_compatibility(manifest: dict, runtime_version: str, gpu_name: str, compute_capability: str) -> None:
    """Refuse engines built for another TensorRT version or GPU generation, naming both and the fix."""
    built = manifest["tensorrt"]
    problems = []
    if built.get("version") != runtime_version:
        problems.append(f"TensorRT version: engine built with {built.get('version')}, this host has {runtime_version}")
    hardware_portable = built.get("hardware_compatibility") == "AMPERE_PLUS" and float(compute_capability) >= 8.0
    if built.get("compute_capability") != compute_capability and not hardware_portable:
        problems.append(
            f"GPU: engine built for compute capability {built.get('compute_capability')} "
            f"({built.get('gpu_name')}), this host has {compute_capability} ({gpu_name})"
        )
    if problems:
        raise ManifestError(
            "This engine bundle cannot run here. "
            + "; ".join(problems)
            + f". Rebuild it on this host: {rebuild_command(manifest)}"
        )
