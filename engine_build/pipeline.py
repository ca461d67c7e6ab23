"""optimize_trt_engine.py's four steps: export (+ parity), quantize (ModelOpt), build (TensorRT), verify + manifest."""

from __future__ import annotations

import datetime
import json
import logging
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine_bundle.manifest import write_manifest

logger = logging.getLogger(__name__)

PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json",
                   "preprocessor_config.json", "generation_config.json", "special_tokens_map.json")  # fmt: skip
GRAPHS = ("vision", "embed", "decoder")


@dataclass
class BuildOptions:
    model_path: Path
    calib_images: Path
    output_path: Path
    precision: str = "int8"
    target: str = "auto"  # auto | tensorrt | tensorrt-rtx | none
    max_seq_len: int = 2048
    max_batch: int = 8
    workspace_gib: float = 8.0
    calibration_method: str = "max"
    calibration_decode_steps: int = 4
    verify_tokens: int = 16
    parity_tolerance: float = 1e-3
    device: str = "auto"
    keep_fp32_onnx: bool = False
    thresholds: dict = field(default_factory=dict)
    command: str = ""


class Step:
    """Logs a numbered step with its duration (the CLI's progress lines)."""

    def __init__(self, number: int, title: str) -> None:
        self.number, self.title = number, title

    def __enter__(self):
        self.started = time.perf_counter()
        logger.info("[%d/4] %s ...", self.number, self.title)
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            logger.info("[%d/4] %s done in %.1f s", self.number, self.title, time.perf_counter() - self.started)


def resolve_target(target: str) -> str | None:
    from engine_build.builder import target_available

    if target == "none":
        return None
    if target != "auto":
        if not target_available(target):
            module = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}[target]
            raise RuntimeError(f"--target {target} needs the {module} package (pip install {target}), which is missing")
        return target
    return "tensorrt" if target_available("tensorrt") else None


def build_bundle(options: BuildOptions) -> dict:
    import torch
    from tqdm import tqdm

    from engine_build.calibration import (
        FeedReader,
        load_calibration_films,
        record_decoder_feeds,
        split_held_out,
    )
    from engine_build.graphs import DecoderShape, export_graphs
    from engine_build.parity import check_export_parity
    from engine_build.quantize import count_qdq, quantize_graph
    from engine_build.verify import AccuracyError, Thresholds, check, compare, thresholds_record
    from pytorch_backend.checkpoint import describe_checkpoint, weights_sha256
    from pytorch_backend.eager import TorchInference
    from trt_inference.trt_model import TRTInference

    started = time.perf_counter()
    out = Path(options.output_path)
    target = resolve_target(options.target)
    checkpoint = describe_checkpoint(options.model_path)
    films = load_calibration_films(options.calib_images)
    calibration_images, held_out = split_held_out(films)
    logger.info("calibration: %d films (%d held out for verification), %d files skipped",
                len(calibration_images), len(held_out), len(films.skipped))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)

    reference = TorchInference(options.model_path, device=options.device)
    model = reference.model
    if model.config.get_text_config()._attn_implementation not in ("eager", "sdpa"):
        model.set_attn_implementation("eager")
    for name in PROCESSOR_FILES:
        if (Path(options.model_path) / name).is_file():
            shutil.copyfile(Path(options.model_path) / name, out / name)
    shape = DecoderShape.from_config(model.config)
    text = model.config.get_text_config()
    shapes = {
        "image_size": model.config.vision_config.image_size, "image_tokens": model.config.mm_tokens_per_image,
        "hidden": shape.hidden, "layers": shape.layers, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
        "vocab": shape.vocab, "sliding_window": shape.sliding_window, "max_sequence": options.max_seq_len,
        "max_batch": options.max_batch,
    }  # fmt: skip
    eos = model.generation_config.eos_token_id
    tokens = {
        "image_token_id": model.config.image_token_id, "boi": model.config.boi_token_id, "eoi": model.config.eoi_token_id,
        "eos": sorted(set(eos if isinstance(eos, list) else [eos])), "bos": text.bos_token_id,
    }  # fmt: skip

    fp32_dir = out / "onnx" / "fp32"
    with Step(1, "export to ONNX and check against PyTorch in ONNX Runtime"):
        pixels = torch.from_numpy(reference_pixels(reference, calibration_images[0])).to(reference.dtype)
        export_graphs(model, fp32_dir, pixels.to(reference.device), progress=lambda g: logger.info("  exported %s", g))
        parity = check_export_parity(model, fp32_dir, pixels, tolerance=options.parity_tolerance)
        logger.info("  parity (max relative error): %s", {k: f"{v:.1e}" for k, v in parity.items()})

    base_manifest = {
        "model": {"id": checkpoint.model_id, "is_demo": checkpoint.is_demo, "weights_sha256": weights_sha256(options.model_path),
                  "source_path": str(Path(options.model_path).resolve())},  # fmt: skip
        "shapes": shapes, "tokens": tokens,
        "tensorrt": {"target": None, "version": None, "gpu_name": None, "compute_capability": None},
        "build": {"command": options.command},
    }  # fmt: skip
    write_manifest(out, {**base_manifest, "precision": "fp32",
                         "graphs": {g: {"onnx": f"onnx/fp32/{g}.onnx", "engine": None} for g in GRAPHS}})  # fmt: skip

    precision_dir = out / "onnx" / options.precision
    precision_dir.mkdir(parents=True, exist_ok=True)
    with Step(2, f"quantize to {options.precision} with ModelOpt"):
        feeds, qdq = [], {}
        if options.precision == "fp32":
            logger.info("  fp32: nothing to quantize; the exported graphs are the bundle's graphs")
        else:
            fp32_bundle = TRTInference(out, executor="onnxruntime-cpu")
            progress = tqdm(total=len(calibration_images), desc="calibration feeds", unit="film", file=sys.stderr)
            feeds, pixel_batches = record_decoder_feeds(fp32_bundle, calibration_images, options.calibration_decode_steps,
                                                        progress=progress.update)  # fmt: skip
            progress.close()
            fp32_bundle.close()
            import numpy as np

            vision_data = {"pixel_values": np.concatenate(pixel_batches)}
            for graph in GRAPHS:
                calibration = vision_data if graph == "vision" else FeedReader(feeds)
                quantize_graph(graph, fp32_dir / f"{graph}.onnx", precision_dir / f"{graph}.onnx", options.precision,
                               calibration, options.calibration_method)  # fmt: skip
                qdq[graph] = count_qdq(precision_dir / f"{graph}.onnx")
                logger.info("  %s: %s", graph, qdq[graph])

    engines = {g: None for g in GRAPHS}
    trt_record = {"target": None, "version": None, "gpu_name": None, "compute_capability": None}
    with Step(3, f"build engines with {target or 'no TensorRT (none installed)'}"):
        if target is None:
            logger.warning(
                "neither tensorrt nor a --target was available: the bundle holds ONNX graphs only. Finish on the GPU "
                "host with: python optimize_trt_engine.py --from_onnx %s --target tensorrt", out,
            )  # fmt: skip
        else:
            engines, trt_record = build_engines(out, precision_dir, shapes, target, options.workspace_gib)

    with Step(4, "verify against PyTorch on held-out films and write the manifest"):
        manifest = {**base_manifest, "precision": options.precision, "tensorrt": trt_record,
                    "graphs": {g: {"onnx": f"onnx/{options.precision}/{g}.onnx", "engine": engines[g]} for g in GRAPHS}}  # fmt: skip
        write_manifest(out, manifest)
        bundle = TRTInference(out, executor="onnxruntime-cpu")
        figures = compare(reference, bundle, held_out, tokens=options.verify_tokens)
        bundle.close()
        thresholds = Thresholds(**options.thresholds)
        failures = check(figures, thresholds)
        logger.info("  accuracy vs PyTorch: %s", json.dumps(figures))
        manifest["accuracy"] = {**figures, "thresholds": thresholds_record(thresholds), "passed": not failures,
                                "export_parity_max_relative_error": parity, "executor": "onnxruntime-cpu"}  # fmt: skip
        manifest["calibration"] = {"films": len(calibration_images), "held_out": len(held_out), "sha256": films.sha256,
                                   "decoder_feeds": len(feeds), "method": options.calibration_method,
                                   "below_recommended": len(films.images) < 50, "qdq_nodes": qdq}  # fmt: skip
        manifest["build"] = {"command": options.command, "seconds": round(time.perf_counter() - started, 1),
                             "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                             "host_python": sys.version.split()[0], "torch": torch.__version__}  # fmt: skip
        write_manifest(out, manifest)
        if not options.keep_fp32_onnx and options.precision != "fp32":
            shutil.rmtree(fp32_dir, ignore_errors=True)
        reference.close()
        if failures:
            raise AccuracyError("precision regression: " + "; ".join(failures) + f" (figures in {out}/manifest.json)")
    return manifest


def reference_pixels(torch_backend, image):
    return torch_backend.processor.image_processor(images=[image], return_tensors="np")["pixel_values"]


def build_engines(bundle: Path, onnx_dir: Path, shapes: dict, target: str, workspace_gib: float):
    from engine_build.builder import EngineBuilder, graph_profiles

    builder = EngineBuilder(target, workspace_gib=workspace_gib, timing_cache=bundle / "engines" / "timing.cache")
    profiles = graph_profiles(shapes)
    engines = {}
    for graph in GRAPHS:
        relative = f"engines/{graph}.plan"
        builder.build(onnx_dir / f"{graph}.onnx", bundle / relative, profiles[graph])
        engines[graph] = relative
    gpu_name, capability = None, None
    if target == "tensorrt":
        from trt_inference.runtime.cuda_memory import device_compute_capability

        gpu_name, capability = device_compute_capability(0)
    else:
        from engine_build.builder import RTX_COMPUTE_CAPABILITIES

        gpu_name, capability = "RTX (ahead of time)", ",".join(RTX_COMPUTE_CAPABILITIES)
    return engines, {"target": target, "version": builder.version, "gpu_name": gpu_name,
                     "compute_capability": capability, "hardware_compatibility": "NONE"}  # fmt: skip


def finish_from_onnx(bundle: Path, target: str, workspace_gib: float) -> dict:
    """Build engines for an ONNX-only bundle (made where TensorRT was absent) and update its manifest."""
    from engine_bundle.manifest import read_manifest

    manifest = read_manifest(bundle)
    onnx_dir = bundle / "onnx" / manifest["precision"]
    engines, trt_record = build_engines(bundle, onnx_dir, manifest["shapes"], target, workspace_gib)
    for graph in GRAPHS:
        manifest["graphs"][graph]["engine"] = engines[graph]
    manifest["tensorrt"] = trt_record
    manifest.pop("format", None)
    write_manifest(bundle, manifest)
    return manifest


def command_line() -> str:
    return " ".join(shlex.quote(part) for part in ["python", *sys.argv])
