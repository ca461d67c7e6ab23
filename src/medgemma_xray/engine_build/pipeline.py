"""optimize_trt_engine.py's steps: checks up front, then export (+ parity), quantize (ModelOpt), build (TensorRT),
verify, and a sealed manifest, all inside a staging folder that replaces the output only once verification passed.
"""

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
from typing import Any

from medgemma_xray.engine_build.precision import BuildPlan, parse_compute_capabilities, plan_build
from medgemma_xray.engine_build.staging import discard, make_staging_dir, publish, refuse_existing_output
from medgemma_xray.engine_build.task_gate import DEFAULT_MAX_F1_DROP, DEFAULT_TASK_PHANTOMS, DEFAULT_TASK_SEED, table
from medgemma_xray.engine_bundle.identity import PROCESSOR_FILES, model_files_sha256
from medgemma_xray.engine_bundle.integrity import seal
from medgemma_xray.engine_bundle.manifest import write_manifest

logger = logging.getLogger(__name__)

GRAPHS = ("vision", "embed", "decoder")
MAX_BATCH_LIMIT = 64
PROMPT_ROOM_TOKENS = 128  # system prompt, chat template and a question around one film's image tokens


class BuildRefusedError(ValueError):
    """The build cannot start as asked (output exists, impossible precision, shapes out of range, too few films)."""


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
    int8_w8a8_layers: tuple[str, ...] = ()  # decoder projections (layers.2/mlp) that take W8A8; the rest weight-only
    verify_tokens: int = 16
    parity_tolerance: float = 1e-3
    device: str = "auto"
    keep_fp32_onnx: bool = False
    overwrite: bool = False
    allow_few_films: bool = False
    compute_capabilities: str | None = None  # TensorRT-RTX targets, e.g. "SM89,SM120"
    thresholds: dict = field(default_factory=dict)
    task_phantoms: int = DEFAULT_TASK_PHANTOMS  # held-out labelled phantoms for the F1 gate; 0 switches it off
    task_seed: int = DEFAULT_TASK_SEED
    max_f1_drop: float = DEFAULT_MAX_F1_DROP  # macro-F1 units: 0.01 is one point
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


def check_shapes(model_path: Path, max_seq_len: int, max_batch: int, verify_tokens: int) -> None:
    """--max_seq_len and --max_batch against the model's own config, before anything is written."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    image_tokens = int(config.get("mm_tokens_per_image", 256))
    longest = int(config.get("text_config", {}).get("max_position_embeddings", 131072))
    shortest = image_tokens + PROMPT_ROOM_TOKENS + verify_tokens
    if not shortest <= max_seq_len <= longest:
        raise BuildRefusedError(
            f"--max_seq_len {max_seq_len} is out of range: one film takes {image_tokens} tokens, so a conversation "
            f"needs at least {shortest} (with --verify_tokens {verify_tokens}); the model allows at most {longest}. "
            "The default is 2048."
        )
    if not 1 <= max_batch <= MAX_BATCH_LIMIT:
        raise BuildRefusedError(
            f"--max_batch {max_batch} is out of range: 1 to {MAX_BATCH_LIMIT} films per vision batch"
        )


def prepare(options: BuildOptions) -> BuildPlan:
    """Every check that needs no model: refuse here, in seconds, rather than after an export."""
    from medgemma_xray.pytorch_backend.checkpoint import describe_checkpoint
    from medgemma_xray.trt_inference.runtime.cuda_memory import probe_cuda_gpu

    refuse_existing_output(options.output_path, options.overwrite)
    describe_checkpoint(options.model_path)
    check_shapes(options.model_path, options.max_seq_len, options.max_batch, options.verify_tokens)
    # --target none builds no plans: no GPU to ask about (the probe imports CUDA's bindings: a refusal stays fast).
    gpu, why_no_gpu = (None, "--target none") if options.target == "none" else probe_cuda_gpu(0)
    capabilities = parse_compute_capabilities(options.compute_capabilities)
    plan = plan_build(options.precision, options.target, capabilities, gpu, why_no_gpu)
    logger.info(
        "plan: %s, engines: %s%s; accuracy measured on %s",
        plan.precision,
        plan.target or "none (ONNX graphs only)",
        f" for {','.join(plan.compute_capabilities)}" if plan.compute_capabilities else "",
        plan.verify_reason,
    )
    return plan


def build_bundle(options: BuildOptions) -> dict:
    """Build into a staging folder beside the output; publish only a verified bundle. Returns its manifest."""
    from medgemma_xray.engine_build.calibration import load_calibration_films, require_enough_films, require_held_out

    plan = prepare(options)
    films = load_calibration_films(options.calib_images)
    require_enough_films(films, options.allow_few_films)
    require_held_out(films)
    staging = make_staging_dir(options.output_path)
    logger.info("building in %s; %s is replaced only once the bundle passed verification", staging, options.output_path)
    try:
        manifest = _build_into(staging, options, plan, films)
        publish(staging, options.output_path, options.overwrite)
    except BaseException:
        discard(staging)
        raise
    return manifest


def _build_into(out: Path, options: BuildOptions, plan: BuildPlan, films) -> dict:
    """The four steps into the staging folder `out`, and the sealed manifest. Returns the manifest."""
    from medgemma_xray.engine_build.calibration import split_held_out
    from medgemma_xray.pytorch_backend.checkpoint import describe_checkpoint
    from medgemma_xray.pytorch_backend.eager import TorchInference

    started = time.perf_counter()
    checkpoint = describe_checkpoint(options.model_path)
    calibration_images, held_out = split_held_out(films)
    logger.info(
        "calibration: %s (%d held out for verification), %d files skipped",
        "none (fp32 is not quantized)" if options.precision == "fp32" else f"{len(calibration_images)} films",
        len(held_out),
        len(films.skipped),
    )

    reference = TorchInference(options.model_path, device=options.device)
    try:
        shapes, tokens = _prepare_reference(reference, options, out)
        fp32_dir = out / "onnx" / "fp32"
        with Step(1, "export to ONNX and check against PyTorch in ONNX Runtime"):
            parity = _export(reference, fp32_dir, calibration_images[0], options.parity_tolerance)
        base = _base_manifest(checkpoint, options, shapes, tokens)
        # The staging folder's own fp32 manifest: lets the fp32 graphs record calibration feeds. Never published.
        write_manifest(out, {**base, "precision": "fp32", "graphs": _graph_files("fp32", dict.fromkeys(GRAPHS))})

        precision_dir = out / "onnx" / options.precision
        precision_dir.mkdir(parents=True, exist_ok=True)
        with Step(2, _quantize_title(options.precision)):
            decoder_feeds, qdq = _quantize(out, fp32_dir, precision_dir, options, calibration_images)

        with Step(3, f"build engines with {plan.target or 'no TensorRT (none installed or --target none)'}"):
            engines, trt_record = _build_engines_step(out, precision_dir, shapes, plan, options)

        with Step(4, f"verify against PyTorch on held-out films ({plan.verify_executor}) and seal the manifest"):
            manifest = {
                **base,
                "precision": options.precision,
                "tensorrt": trt_record,
                "graphs": _graph_files(options.precision, engines),
            }
            write_manifest(out, manifest)
            figures, task, thresholds = _verify(out, reference, held_out, options, plan)
            manifest["accuracy"] = _accuracy_record(figures, task, thresholds, parity, reference, options, plan)
            manifest["calibration"] = _calibration_record(
                films, len(calibration_images), len(held_out), decoder_feeds, qdq, options
            )
            manifest["build"] = _build_record(base["build"], started)
            if not options.keep_fp32_onnx and options.precision != "fp32":
                shutil.rmtree(fp32_dir, ignore_errors=True)
            manifest = seal(out, manifest)
            write_manifest(out, manifest)
    finally:
        reference.close()
    return manifest


def _prepare_reference(reference, options: BuildOptions, out: Path) -> tuple[dict, dict]:
    """Eager attention for the export, the processor files copied into the bundle; the bundle's shapes and tokens."""
    from medgemma_xray.engine_build.graphs import DecoderShape

    model = reference.model
    if model.config.get_text_config()._attn_implementation not in ("eager", "sdpa"):
        model.set_attn_implementation("eager")
    for name in PROCESSOR_FILES:
        if (Path(options.model_path) / name).is_file():
            shutil.copyfile(Path(options.model_path) / name, out / name)
    shape = DecoderShape.from_config(model.config)
    text = model.config.get_text_config()
    shapes = {
        "image_size": model.config.vision_config.image_size,
        "image_tokens": model.config.mm_tokens_per_image,
        "hidden": shape.hidden,
        "layers": shape.layers,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab": shape.vocab,
        "sliding_window": shape.sliding_window,
        "max_sequence": options.max_seq_len,
        "max_batch": options.max_batch,
    }
    eos = model.generation_config.eos_token_id
    tokens = {
        "image_token_id": model.config.image_token_id,
        "boi": model.config.boi_token_id,
        "eoi": model.config.eoi_token_id,
        "eos": sorted(set(eos if isinstance(eos, list) else [eos])),
        "bos": text.bos_token_id,
    }
    return shapes, tokens


def _export(reference, fp32_dir: Path, film, tolerance: float) -> dict:
    """Step 1: the fp32 ONNX graphs, and their largest relative error against PyTorch in ONNX Runtime."""
    import torch

    from medgemma_xray.engine_build.graphs import export_graphs
    from medgemma_xray.engine_build.parity import check_export_parity

    model = reference.model
    pixels = torch.from_numpy(reference_pixels(reference, film)).to(reference.dtype)
    export_graphs(model, fp32_dir, pixels.to(reference.device), progress=lambda g: logger.info("  exported %s", g))
    parity = check_export_parity(model, fp32_dir, pixels, tolerance=tolerance)
    logger.info("  parity (max relative error): %s", {k: f"{v:.1e}" for k, v in parity.items()})
    return parity


def _base_manifest(checkpoint, options: BuildOptions, shapes: dict, tokens: dict) -> dict:
    """What every manifest of this build says: the model, its shapes and tokens, the command."""
    from medgemma_xray.pytorch_backend.checkpoint import weights_sha256

    return {
        "model": {
            "id": checkpoint.model_id,
            "is_demo": checkpoint.is_demo,
            "demo_notice": checkpoint.demo_notice,
            "profile": checkpoint.profile.as_manifest(),  # which checkpoint, and its capabilities
            "weights_sha256": weights_sha256(options.model_path),
            "files_sha256": model_files_sha256(options.model_path),
            "source_path": str(Path(options.model_path).resolve()),
        },
        "shapes": shapes,
        "tokens": tokens,
        "tensorrt": {"target": None, "version": None, "gpu_name": None, "compute_capability": None},
        "build": {"command": options.command, "commands": [options.command]},
    }


def _graph_files(precision: str, engines: dict) -> dict:
    return {g: {"onnx": f"onnx/{precision}/{g}.onnx", "engine": engines[g]} for g in GRAPHS}


def _quantize(out: Path, fp32_dir: Path, precision_dir: Path, options: BuildOptions, calibration_images) -> tuple:
    """Step 2: Q/DQ graphs calibrated on the decoder feeds the fp32 bundle records. Returns (feeds, Q/DQ counts)."""
    import numpy as np
    from tqdm import tqdm

    from medgemma_xray.engine_build.calibration import FeedReader, record_decoder_feeds
    from medgemma_xray.engine_build.quantize import count_qdq, quantize_graph
    from medgemma_xray.trt_inference.trt_model import TRTInference

    feeds: list[Any] = []
    qdq: dict[str, Any] = {}
    if options.precision == "fp32":
        logger.info("  fp32: nothing to quantize; the exported graphs are the bundle's graphs")
        return 0, qdq
    fp32_bundle = TRTInference(out, executor="onnxruntime-cpu", require_verified=False)
    progress = tqdm(total=len(calibration_images), desc="calibration feeds", unit="film", file=sys.stderr)
    feeds, pixel_batches = record_decoder_feeds(
        fp32_bundle, calibration_images, options.calibration_decode_steps, progress=progress.update
    )
    progress.close()
    fp32_bundle.close()
    vision_data = {"pixel_values": np.concatenate(pixel_batches)}
    for graph in GRAPHS:
        calibration = vision_data if graph == "vision" else FeedReader(feeds)
        quantize_graph(
            graph,
            fp32_dir / f"{graph}.onnx",
            precision_dir / f"{graph}.onnx",
            options.precision,
            calibration,
            options.calibration_method,
            w8a8_layers=options.int8_w8a8_layers,
        )
        qdq[graph] = count_qdq(precision_dir / f"{graph}.onnx")
        logger.info("  %s: %s", graph, qdq[graph])
    return len(feeds), qdq


def _build_engines_step(out: Path, precision_dir: Path, shapes: dict, plan: BuildPlan, options: BuildOptions):
    """Step 3: TensorRT plans where a target was chosen; else the bundle holds ONNX graphs only."""
    if plan.target is None:
        logger.warning(
            "no engines built: the bundle holds ONNX graphs only. Finish on the GPU host with: "
            "python optimize_trt_engine.py --from_onnx %s --target tensorrt",
            options.output_path,
        )
        return dict.fromkeys(GRAPHS), {"target": None, "version": None, "gpu_name": None, "compute_capability": None}
    return build_engines(out, precision_dir, shapes, plan, options.workspace_gib)


def _verify(out: Path, reference, held_out, options: BuildOptions, plan: BuildPlan):
    """Step 4's gate: the bundle against PyTorch on held-out films and phantoms. Raises AccuracyError on a miss."""
    from medgemma_xray.engine_build.task_gate import failure_message as task_failure_message
    from medgemma_xray.engine_build.task_gate import measure_task_accuracy
    from medgemma_xray.engine_build.verify import AccuracyError, Thresholds, check, measure_accuracy
    from medgemma_xray.trt_inference.trt_model import TRTInference

    thresholds = Thresholds(**options.thresholds)
    bundle = TRTInference(out, executor=plan.verify_executor, require_verified=False)
    try:
        figures = measure_accuracy(
            reference, bundle, held_out, tokens=options.verify_tokens, max_sequence=options.max_seq_len
        )
        logger.info("  accuracy vs PyTorch: %s", json.dumps(figures))
        failures = check(figures, thresholds)
        if failures:  # stop here: the F1 gate cannot rescue a bundle that already failed
            raise AccuracyError(
                "precision regression: " + "; ".join(failures) + f" (measured on {plan.verify_reason}; "
                f"{options.output_path} left as it was; the F1 gate was not run). {remedies(options, failures)} "
                f"Figures: {json.dumps(figures)}"
            )
        task = measure_task_accuracy(reference, bundle, options.task_phantoms, options.task_seed, options.max_f1_drop)
    finally:
        bundle.close()
    log_task_accuracy(task)
    if not task["passed"]:
        raise AccuracyError(
            f"precision regression: {task_failure_message(task)} (measured on {plan.verify_reason}; "
            f"{options.output_path} left as it was)"
        )
    return figures, task, thresholds


def remedies(options: BuildOptions, failures: list[str]) -> str:
    """What to do about a failed accuracy check, and what each remedy costs."""
    higher = [name for name in ("fp16", "fp32") if name != options.precision]
    text = (
        f"Remedies: build another precision (--precision {' or '.join(higher)}: fp16 halves the weights and passes "
        "the long conversation on the demo model, fp32 is exact and twice fp16's size and time)"
    )
    if options.precision == "int8" and not options.int8_w8a8_layers:
        text += "; or more and more varied calibration films (--calibration_method entropy)"
    if options.int8_w8a8_layers:
        text += (
            f"; or fewer W8A8 layers (--int8_w8a8_layers {','.join(options.int8_w8a8_layers)} now; weight-only INT8 "
            "on every projection holds the long conversation on the demo model)"
        )
    if any(failure.startswith("long conversation") for failure in failures):
        text += (
            "; or accept the drift with a lower --min_long_token_agreement / --min_long_top1_agreement or a higher "
            "--max_long_kl: the bundle then answers differently from PyTorch in long conversations, and every status "
            "surface (the ready line, status_gradio.sh, /metrics, the page's badge) marks the threshold as lowered"
        )
    return text + "."


def _accuracy_record(figures: dict, task: dict, thresholds, parity: dict, reference, options, plan) -> dict:
    from medgemma_xray.engine_build.verify import thresholds_record

    return {
        **figures,
        "task_accuracy": task,
        "thresholds": {**thresholds_record(thresholds), "max_macro_f1_drop": options.max_f1_drop},
        "passed": True,
        "failures": [],
        "export_parity_max_relative_error": parity,
        "executor": plan.verify_executor,
        "measured_on": plan.verify_reason,
        "plans_verified": plan.verify_executor == "tensorrt",
        "reference": f"PyTorch ({reference.precision}, {reference.device})",
    }


def _quantize_title(precision: str) -> str:
    if precision == "fp32":
        return "no quantization: fp32 serves the exported graphs"
    if precision in ("fp16", "bf16"):
        return f"cast to {precision} with ModelOpt AutoCast"
    return f"quantize to {precision} with ModelOpt"


def _calibration_record(films, calibrated: int, held_out: int, decoder_feeds: int, qdq: dict, options) -> dict:
    """What calibrated the bundle; for fp32 only the held-out films (nothing was calibrated) and their hash, which
    --from_onnx needs to find the same held-out films again."""
    from medgemma_xray.engine_build.calibration import MIN_RECOMMENDED_FILMS

    if options.precision == "fp32":
        return {
            "used": False,
            "note": "fp32 is not quantized: no film calibrated anything; the held-out films gated the bundle",
            "held_out": held_out,
            "sha256": films.sha256,
            "skipped_files": films.skipped,
        }
    return {
        "used": True,
        "films": calibrated,
        "held_out": held_out,
        "sha256": films.sha256,
        "decoder_feeds": decoder_feeds,
        "method": options.calibration_method,
        "real_films": films.real_films,
        "synthetic_films": len(films.synthetic),
        "below_recommended": films.real_films < MIN_RECOMMENDED_FILMS,
        "skipped_files": films.skipped,
        "qdq_nodes": qdq,
        **({"int8_recipe": _int8_recipe(options)} if options.precision == "int8" else {}),
    }


def _int8_recipe(options) -> dict:
    """What INT8 means in this bundle, graph by graph (medgemma_xray.engine_build.quantize says why)."""
    w8a8 = list(options.int8_w8a8_layers)
    return {
        "vision": "W8A8: ModelOpt Q/DQ, per-channel weights, calibrated per-tensor activations",
        "decoder": "weight-only INT8 (W8A16): per-output-channel symmetric weights behind DequantizeLinear, fp32 "
        "activations" + (f"; W8A8 (ModelOpt) on {', '.join(w8a8)}" if w8a8 else ""),
        "decoder_w8a8_layers": w8a8,
        "higher_precision": "norms, rotary embedding, attention scores and softmax, the KV cache, lm_head (fp32)",
    }


def _build_record(base: dict, started: float) -> dict:
    import torch

    return {
        **base,
        "seconds": round(time.perf_counter() - started, 1),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host_python": sys.version.split()[0],
        "torch": torch.__version__,
    }


def log_task_accuracy(task: dict) -> None:
    if not task["enabled"]:
        logger.warning("  %s", task["note"])
        return
    logger.info(
        "  task accuracy on %d held-out phantoms: macro-F1 PyTorch %.3f, bundle %.3f (drop %.3f, allowed %.3f)\n%s",
        task["phantoms"],
        task["pytorch"]["macro_f1"],
        task["bundle"]["macro_f1"],
        task["macro_f1_drop"],
        task["max_macro_f1_drop"],
        table(task),
    )
    if "note" in task:
        logger.warning("  %s", task["note"])


def reference_pixels(torch_backend, image):
    return torch_backend.processor.image_processor(images=[image], return_tensors="np")["pixel_values"]


def build_engines(bundle: Path, onnx_dir: Path, shapes: dict, plan: BuildPlan, workspace_gib: float):
    from medgemma_xray.engine_build.builder import EngineBuilder, graph_profiles

    if plan.target is None:
        raise ValueError("build_engines needs a plan with a TensorRT target; this plan builds no engines.")
    builder = EngineBuilder(
        plan.target,
        workspace_gib=workspace_gib,
        timing_cache=bundle / "engines" / "timing.cache",
        compute_capabilities=plan.compute_capabilities or (),
    )
    profiles = graph_profiles(shapes)
    engines = {}
    for graph in GRAPHS:
        relative = f"engines/{graph}.plan"
        builder.build(onnx_dir / f"{graph}.onnx", bundle / relative, profiles[graph])
        engines[graph] = relative
    if plan.target == "tensorrt":
        from medgemma_xray.trt_inference.runtime.cuda_memory import device_compute_capability

        gpu_name, capability = device_compute_capability(0)
    else:
        gpu_name, capability = "RTX (ahead of time)", ",".join(plan.compute_capabilities)
    return engines, {
        "target": plan.target,
        "version": builder.version,
        "gpu_name": gpu_name,
        "compute_capability": capability,
        "hardware_compatibility": "NONE",
    }


def command_line() -> str:
    return " ".join(shlex.quote(part) for part in ["python", *sys.argv])
