"""--from_onnx: build the plans of a verified ONNX-only bundle on the host that will run them.

Where the new plans can run here (TensorRT on this GPU, or TensorRT-RTX on a GPU it targets), the accuracy gate
runs again, on the plans, against PyTorch on the same held-out films (the films must be the ones the bundle was
calibrated on: their hash is recorded) and the same thresholds; only then does the record say plans_verified:
true. Where they cannot run, the bundle keeps its ONNX Runtime figures and says plans_verified: false, and the
runtime refuses to serve those plans without ALLOW_UNVERIFIED_PLANS=1.
"""

from __future__ import annotations

import logging
from pathlib import Path

from medgemma_xray.engine_build.pipeline import GRAPHS, BuildRefusedError, build_engines, log_task_accuracy
from medgemma_xray.engine_build.precision import BuildPlan, parse_compute_capabilities, plan_build
from medgemma_xray.engine_build.staging import clone_bundle, discard, make_staging_dir, publish
from medgemma_xray.engine_bundle.integrity import seal, verify_bundle
from medgemma_xray.engine_bundle.manifest import read_manifest, write_manifest

logger = logging.getLogger(__name__)


def held_out_films(manifest: dict, calib_images: Path | None) -> list:
    """The bundle's held-out films, from the same folder it was calibrated on (checked by the recorded hash)."""
    from medgemma_xray.engine_build.calibration import load_calibration_films, split_held_out

    if calib_images is None:
        raise BuildRefusedError(
            "these plans can run on this host, so --from_onnx verifies them against PyTorch on the bundle's "
            "held-out films: pass --calib_images with the folder the bundle was calibrated on"
        )
    films = load_calibration_films(calib_images)
    recorded = manifest.get("calibration", {}).get("sha256")
    if films.sha256 != recorded:
        raise BuildRefusedError(
            f"--calib_images {calib_images} is not the set the bundle was calibrated on (SHA-256 "
            f"{films.sha256[:16]}..., recorded {str(recorded)[:16]}...): its held-out films would not be the ones "
            "its figures came from. Pass the same folder."
        )
    return split_held_out(films)[1]


def verify_plans(bundle: Path, manifest: dict, plan: BuildPlan, held_out: list, model_path: Path, device: str) -> dict:
    """The gate on the plans (TensorRT executor) against PyTorch: the accuracy record with plans_verified: true,
    or AccuracyError. Thresholds, token counts and the F1 gate's phantoms are the ones the bundle recorded."""
    from medgemma_xray.engine_build.task_gate import failure_message, measure_task_accuracy
    from medgemma_xray.engine_build.verify import AccuracyError, check, measure_accuracy, thresholds_from_record
    from medgemma_xray.pytorch_backend.eager import TorchInference
    from medgemma_xray.trt_inference.trt_model import TRTInference

    old = manifest["accuracy"]
    thresholds = thresholds_from_record(old["thresholds"])
    task_record = old.get("task_accuracy") or {}
    write_manifest(bundle, manifest)
    reference = TorchInference(model_path, device=device)
    try:
        plans = TRTInference(bundle, executor="tensorrt", require_verified=False)
        try:
            figures = measure_accuracy(
                reference,
                plans,
                held_out,
                tokens=old.get("tokens_compared", 16),
                max_sequence=manifest["shapes"]["max_sequence"],
            )
            if task_record.get("enabled"):
                first, last = task_record["seeds"]
                task = measure_task_accuracy(
                    reference, plans, last - first + 1, first, task_record["max_macro_f1_drop"]
                )
            else:
                task = measure_task_accuracy(reference, plans, 0, 0, 0.0)
        finally:
            plans.close()
        reference_name = f"PyTorch ({reference.precision}, {reference.device})"
    finally:
        reference.close()
    log_task_accuracy(task)
    failures = check(figures, thresholds)
    if failures or not task["passed"]:
        messages = [*failures, *([failure_message(task)] if not task["passed"] else [])]
        raise AccuracyError(
            "precision regression on the plans: " + "; ".join(messages) + f" (measured on {plan.verify_reason}; the "
            "bundle was left as it was)"
        )
    return {
        **figures,
        "task_accuracy": task,
        "thresholds": old["thresholds"],
        "passed": True,
        "failures": [],
        "export_parity_max_relative_error": old.get("export_parity_max_relative_error"),
        "executor": "tensorrt",
        "measured_on": plan.verify_reason,
        "plans_verified": True,
        "reference": reference_name,
        "onnxruntime_figures": {key: old.get(key) for key in ("executor", "measured_on", "token_agreement_mean")},
    }


def finish_from_onnx(
    bundle: Path,
    target: str,
    workspace_gib: float,
    compute_capabilities: str | None = None,
    command: str = "",
    calib_images: Path | None = None,
    model_path: Path | None = None,
    device: str = "auto",
) -> dict:
    """Build engines for a verified ONNX-only bundle (made where TensorRT was absent); verify them where they run
    here; replace the bundle atomically."""
    from medgemma_xray.trt_inference.runtime.cuda_memory import probe_cuda_gpu

    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    verify_bundle(bundle, manifest)  # only a bundle that passed its gate, with its files intact, is finished
    gpu, why_no_gpu = probe_cuda_gpu(0)
    plan = plan_build(manifest["precision"], target, parse_compute_capabilities(compute_capabilities), gpu, why_no_gpu)
    held_out, reference_model = None, None
    if plan.verify_executor == "tensorrt":  # refuse before building anything
        from medgemma_xray.engine_bundle.identity import check_model_identity

        held_out = held_out_films(manifest, calib_images)
        reference_model = Path(model_path or manifest["model"]["source_path"])
        check_model_identity(bundle, manifest, reference_model)
    staging = make_staging_dir(bundle)
    try:
        clone_bundle(bundle, staging)
        onnx_dir = staging / "onnx" / manifest["precision"]
        engines, trt_record = build_engines(staging, onnx_dir, manifest["shapes"], plan, workspace_gib)
        for graph in GRAPHS:
            manifest["graphs"][graph]["engine"] = engines[graph]
        manifest["tensorrt"] = trt_record
        build = manifest.setdefault("build", {})
        build["commands"] = [*(build.get("commands") or [build.get("command", "")]), command]
        build["command"] = command
        if held_out is not None and reference_model is not None:  # (both are set together above)
            manifest["accuracy"] = verify_plans(staging, manifest, plan, held_out, reference_model, device)
        else:
            # The gate was measured on the ONNX graphs; these plans have not been run. Say so in the record.
            logger.warning(
                "the new plans cannot run on this host (%s): the bundle keeps its ONNX Runtime figures and records "
                "plans_verified: false; serving the plans needs ALLOW_UNVERIFIED_PLANS=1 until a build on their GPU "
                "verifies them",
                plan.verify_reason,
            )
            manifest["accuracy"]["plans_verified"] = False
        manifest = seal(staging, manifest)
        write_manifest(staging, manifest)
        publish(staging, bundle, overwrite=True)
    except BaseException:
        discard(staging)
        raise
    return manifest
