"""Build a MedGemma engine bundle: ONNX export (checked against PyTorch), ModelOpt INT8/FP8 Q/DQ or FP16/BF16
AutoCast calibrated on your films, a TensorRT (or TensorRT-RTX) build, and an accuracy-checked manifest.

Example (GPU host with TensorRT):
  python optimize_trt_engine.py --model_path /models/medgemma-4b-it --calib_images calib_dataset \
      --precision int8 --output_path engines/medgemma-int8
The bundle is built in a staging folder beside --output_path and moved into place only once it passed
verification; an existing output is replaced (atomically) only with --overwrite, and a failed build leaves it
as it was. Impossible requests (a precision no executor here can verify, fp8 for GPUs that cannot run it, shapes
out of range, too few films) are refused before any work starts.
Exit status: 0 built; 1 a step failed (the message says which and why); 2 refused before any work: a
configuration error (missing model, empty or missing --calib_images, too few films, an impossible precision or
shape, an existing output, a corrupt --from_onnx bundle) that running again unchanged cannot fix.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

logger = logging.getLogger("optimize_trt_engine")


def parse_args(argv):
    from medgemma_xray.engine_build.task_gate import DEFAULT_MAX_F1_DROP, DEFAULT_TASK_PHANTOMS, DEFAULT_TASK_SEED

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", type=Path, help="MedGemma / Gemma 3 checkpoint directory (default: demo model)")
    parser.add_argument(
        "--calib_images", type=Path, default=Path("calib_dataset"), help="folder of films (DICOM/PNG/JPEG)"
    )
    parser.add_argument("--precision", choices=["int8", "fp8", "fp16", "bf16", "fp32"], default="int8")
    parser.add_argument("--output_path", type=Path, help="bundle folder to write")
    parser.add_argument(
        "--target",
        choices=["auto", "tensorrt", "tensorrt-rtx", "none"],
        default="auto",
        help="engine builder; auto = tensorrt if installed, else an ONNX-only bundle",
    )
    parser.add_argument("--max_seq_len", type=int, default=2048, help="longest conversation + answer, in tokens")
    parser.add_argument("--max_batch", type=int, default=8, help="largest vision batch (batch feature extraction)")
    parser.add_argument("--workspace_gib", type=float, default=8.0)
    parser.add_argument("--calibration_method", choices=["max", "entropy"], default="max")
    parser.add_argument("--verify_tokens", type=int, default=16, help="greedy tokens compared with PyTorch")
    parser.add_argument("--min_cosine", type=float, default=0.99)
    parser.add_argument("--min_token_agreement", type=float, default=0.9)
    parser.add_argument(
        "--min_long_token_agreement",
        type=float,
        default=0.9,
        help="greedy agreement with PyTorch on the long multi-turn case (>= 1,536 tokens where --max_seq_len allows)",
    )
    parser.add_argument(
        "--min_long_top1_agreement",
        type=float,
        default=0.9,
        help="top-1 agreement with PyTorch at every position of the long case's answer (PyTorch's answer fed to both)",
    )
    parser.add_argument("--max_kl", type=float, default=0.05, help="largest first-token KL divergence (nats)")
    parser.add_argument(
        "--max_long_kl",
        type=float,
        default=0.05,
        help="largest KL divergence (nats) at any position of the long case's answer (PyTorch's answer fed to both)",
    )
    parser.add_argument(
        "--int8_w8a8_layers",
        default="",
        help="int8: decoder projections that take W8A8 (INT8 activations), e.g. layers.2/mlp,layers.3/self_attn; "
        "the rest take weight-only INT8. Choose them with benchmarks/int8_sensitivity.py",
    )
    parser.add_argument(
        "--max_logprob_delta",
        type=float,
        default=0.1,
        help="largest log-probability difference (nats) on tokens both agree on",
    )
    parser.add_argument(
        "--task_phantoms",
        type=int,
        default=DEFAULT_TASK_PHANTOMS,
        help="held-out labelled phantoms asked every finding through PyTorch and the bundle (the F1 gate); 0: off",
    )
    parser.add_argument(
        "--task_seed", type=int, default=DEFAULT_TASK_SEED, help="first held-out phantom seed of the F1 gate"
    )
    parser.add_argument(
        "--max_f1_drop",
        type=float,
        default=DEFAULT_MAX_F1_DROP,
        help="largest macro-F1 drop of the bundle below PyTorch, in F1 units (0.01 = one point)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where PyTorch runs")
    parser.add_argument("--keep_fp32_onnx", action="store_true")
    parser.add_argument(
        "--from_onnx",
        type=Path,
        help="finish an ONNX-only bundle: build its engines with --target; where they run here, verify them "
        "against PyTorch (--calib_images: the bundle's own films; --model_path: default its recorded checkpoint)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output_path (atomically)")
    parser.add_argument(
        "--allow_few_films",
        action="store_true",
        help="build with fewer than 50 real films (tests, demos); the manifest records it",
    )
    parser.add_argument(
        "--compute_capabilities", help="TensorRT-RTX targets, e.g. SM89,SM120 (default: all; fp8: SM89+)"
    )
    args = parser.parse_args(argv)
    args.calib_images_given = any(part.startswith("--calib_images") for part in (argv or sys.argv[1:]))
    return args


def _stop_on_sigterm() -> None:
    """SIGTERM (systemd, kill, a CI timeout) ends the build through the same path as an error: the staging folder
    is removed and the previous bundle stays as it was. (SIGKILL cannot be caught: the next build removes what
    such a build left.)"""

    def stop(signum, frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    _stop_on_sigterm()
    from medgemma_xray.engine_build.calibration import CalibrationInputError, TooFewFilmsError
    from medgemma_xray.engine_build.finish import finish_from_onnx
    from medgemma_xray.engine_build.pipeline import BuildOptions, BuildRefusedError, build_bundle, command_line
    from medgemma_xray.engine_build.precision import PrecisionRefusedError
    from medgemma_xray.engine_build.staging import OutputExistsError
    from medgemma_xray.engine_bundle.manifest import ManifestError
    from medgemma_xray.pytorch_backend.checkpoint import CheckpointError

    refusals = (
        BuildRefusedError,
        PrecisionRefusedError,
        OutputExistsError,
        TooFewFilmsError,
        CheckpointError,
        CalibrationInputError,
    )
    try:
        if args.from_onnx:
            if args.target in ("auto", "none"):
                logger.error("--from_onnx needs --target tensorrt or --target tensorrt-rtx")
                return 2
            calib_images = args.calib_images if args.calib_images_given else None
            manifest = finish_from_onnx(
                args.from_onnx,
                args.target,
                args.workspace_gib,
                args.compute_capabilities,
                command=command_line(),
                calib_images=calib_images,
                model_path=args.model_path,
                device=args.device,
            )
            verified = manifest["accuracy"]["plans_verified"]
            print(
                f"engines built with {args.target} {manifest['tensorrt']['version']} into {args.from_onnx}; "
                + (
                    f"verified on the plans (token agreement {manifest['accuracy']['token_agreement_mean']:.2f})"
                    if verified
                    else "the plans cannot run here and were not verified (plans_verified: false): serving them "
                    "needs ALLOW_UNVERIFIED_PLANS=1, or finish the bundle on the GPU that runs them"
                )
            )
            return 0
        if args.output_path is None:
            logger.error("--output_path is required")
            return 2
        model_path = args.model_path
        if model_path is None:
            from medgemma_xray.demo_model.install import install_trained_checkpoint
            from medgemma_xray.serving.settings import DEMO_MODEL_DIR

            model_path = install_trained_checkpoint(DEMO_MODEL_DIR)
            logger.warning(
                "no --model_path: building from the demo checkpoint (synthetic phantoms, not a medical model)"
            )
        options = BuildOptions(
            model_path=model_path,
            calib_images=args.calib_images,
            output_path=args.output_path,
            precision=args.precision,
            target=args.target,
            max_seq_len=args.max_seq_len,
            max_batch=args.max_batch,
            workspace_gib=args.workspace_gib,
            calibration_method=args.calibration_method,
            verify_tokens=args.verify_tokens,
            device=args.device,
            keep_fp32_onnx=args.keep_fp32_onnx,
            overwrite=args.overwrite,
            allow_few_films=args.allow_few_films,
            compute_capabilities=args.compute_capabilities,
            thresholds={
                "min_cosine": args.min_cosine,
                "min_token_agreement": args.min_token_agreement,
                "min_long_token_agreement": args.min_long_token_agreement,
                "min_long_top1_agreement": args.min_long_top1_agreement,
                "max_logprob_delta": args.max_logprob_delta,
                "max_kl": args.max_kl,
                "max_long_kl": args.max_long_kl,
            },
            int8_w8a8_layers=tuple(part.strip() for part in args.int8_w8a8_layers.split(",") if part.strip()),
            task_phantoms=args.task_phantoms,
            task_seed=args.task_seed,
            max_f1_drop=args.max_f1_drop,
            command=command_line(),
        )
        manifest = build_bundle(options)
    except refusals as exc:  # nothing was written: say what to change
        logger.error("refused before any work: %s", exc)
        return 2
    except ManifestError as exc:  # --from_onnx on a bundle that is not a finished, intact one
        logger.error("engine build refused: %s", exc)
        return 2
    except Exception as exc:  # every failure: one clear line, non-zero exit
        logger.debug("build failed", exc_info=True)
        logger.error("engine build failed: %s: %s", type(exc).__name__, exc)
        return 1
    from medgemma_xray.engine_bundle.gate import gate_summary

    accuracy = manifest["accuracy"]
    print(
        f"bundle ready: {args.output_path} ({manifest['precision']}, "
        f"engines: {manifest['tensorrt']['target'] or 'none, ONNX only'}; measured on {accuracy['executor']}); "
        f"gate: {gate_summary(accuracy)}"
    )
    print(task_accuracy_summary(accuracy["task_accuracy"]))
    return 0


def task_accuracy_summary(task: dict) -> str:
    """The F1 gate's verdict and its per-finding table, or why it was not measured."""
    from medgemma_xray.engine_build.task_gate import table

    if not task["enabled"]:
        return f"task accuracy: {task['note']}"
    heading = (
        f"task accuracy on {task['phantoms']} held-out phantoms (seeds {task['seeds'][0]}..{task['seeds'][1]}): "
        f"macro-F1 drop {task['macro_f1_drop'] * 100:.1f} points (allowed {task['max_macro_f1_drop'] * 100:.1f})"
    )
    return "\n".join([heading, table(task), *([task["note"]] if "note" in task else [])])


if __name__ == "__main__":
    raise SystemExit(main())
