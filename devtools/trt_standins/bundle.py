"""Stand-in plans for a bundle, and installing the stand-in modules where the executor imports them."""

from __future__ import annotations

import contextlib
import shutil
import sys
import types
from pathlib import Path

from devtools.trt_standins.tensorrt_runtime import STANDIN_VERSION, encode_plan


def make_standin_bundle(source: Path, target: Path, gpu_name: str, compute_capability: str) -> Path:
    """Copy a verified ONNX bundle and give it stand-in plans (its own graphs + the builder's real profiles).

    The accuracy record is the source bundle's: it was measured on these same graphs. The copy is sealed anew.
    """
    from medgemma_xray.engine_build.builder import graph_profiles
    from medgemma_xray.engine_bundle.integrity import seal, verify_bundle
    from medgemma_xray.engine_bundle.manifest import read_manifest, write_manifest

    source, target = Path(source), Path(target)
    verify_bundle(source, read_manifest(source))
    shutil.copytree(source, target)
    manifest = read_manifest(target)
    profiles = graph_profiles(manifest["shapes"])
    (target / "engines").mkdir(exist_ok=True)
    for graph, entry in manifest["graphs"].items():
        onnx_path = target / entry["onnx"]
        if onnx_path.with_name(onnx_path.name + ".data").exists():
            raise ValueError(f"{onnx_path} has external data; stand-in plans embed small graphs only")
        plan = target / "engines" / f"{graph}.plan"
        plan.write_bytes(encode_plan(graph, profiles[graph].shapes, onnx_path.read_bytes()))
        entry["engine"] = f"engines/{graph}.plan"
    manifest["tensorrt"] = {
        "target": "tensorrt",
        "version": STANDIN_VERSION,
        "gpu_name": gpu_name,
        "compute_capability": compute_capability,
        "hardware_compatibility": "NONE",
        "standin": "devtools.trt_standins: ONNX Runtime behind TensorRT's runtime API",
    }
    write_manifest(target, seal(target, manifest))
    return target


@contextlib.contextmanager
def installed(tensorrt: types.ModuleType, cudart: types.ModuleType | None = None):
    """Make `import tensorrt` (and, if given, `from cuda.bindings import runtime`) find the stand-ins; undo after."""
    saved = {name: sys.modules.get(name) for name in ("tensorrt", "cuda", "cuda.bindings", "cuda.bindings.runtime")}
    saved_attribute = None
    sys.modules["tensorrt"] = tensorrt
    if cudart is not None:
        bindings = sys.modules.get("cuda.bindings")
        if bindings is None:  # no cuda-python here: fake the two packages around the module
            cuda = types.ModuleType("cuda")
            bindings = types.ModuleType("cuda.bindings")
            cuda.bindings = bindings
            sys.modules["cuda"], sys.modules["cuda.bindings"] = cuda, bindings
        else:
            saved_attribute = getattr(bindings, "runtime", None)
        bindings.runtime = cudart
        sys.modules["cuda.bindings.runtime"] = cudart
    try:
        yield
    finally:
        if cudart is not None and saved_attribute is not None:
            sys.modules["cuda.bindings"].runtime = saved_attribute
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
