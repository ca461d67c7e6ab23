"""Build a MedGemma engine bundle: ONNX export (checked against PyTorch), ModelOpt INT8/FP8 Q/DQ or FP16/BF16
AutoCast calibrated on your films, a TensorRT (or TensorRT-RTX) build, and an accuracy-checked manifest.

Example (GPU host with TensorRT):
  python optimize_trt_engine.py --model_path /models/medgemma-4b-it --calib_images calib_dataset \
      --precision int8 --output_path engines/medgemma-int8
Exit status: 0 built; 1 a step failed (the message says which and why); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

logger = logging.getLogger("optimize_trt_engine")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", type=Path, help="MedGemma / Gemma 3 checkpoint directory (default: demo model)")
    parser.add_argument(
        "--calib_images", type=Path, default=Path("calib_dataset"), help="folder of films (DICOM/PNG/JPEG)"
    )
    parser.add_argument("--precision", choices=["int8", "fp8", "fp16", "bf16", "fp32"], default="int8")
    parser.add_argument("--output_path", type=Path, help="bundle folder to write")
    parser.add_argument("--target", choices=["auto", "tensorrt", "tensorrt-rtx", "none"], default="auto",
                        help="engine builder; auto = tensorrt if installed, else an ONNX-only bundle")  # fmt: skip
    parser.add_argument("--max_seq_len", type=int, default=2048, help="longest conversation + answer, in tokens")
    parser.add_argument("--max_batch", type=int, default=8, help="largest vision batch (batch feature extraction)")
    parser.add_argument("--workspace_gib", type=float, default=8.0)
    parser.add_argument("--calibration_method", choices=["max", "entropy"], default="max")
    parser.add_argument("--verify_tokens", type=int, default=16, help="greedy tokens compared with PyTorch")
    parser.add_argument("--min_cosine", type=float, default=0.99)
    parser.add_argument("--min_token_agreement", type=float, default=0.9)
    parser.add_argument("--max_kl", type=float, default=0.05)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where PyTorch runs")
    parser.add_argument("--keep_fp32_onnx", action="store_true")
    parser.add_argument("--from_onnx", type=Path, help="finish an ONNX-only bundle: build its engines with --target")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    from engine_build.pipeline import BuildOptions, build_bundle, command_line, finish_from_onnx

    try:
        if args.from_onnx:
            if args.target in ("auto", "none"):
                logger.error("--from_onnx needs --target tensorrt or --target tensorrt-rtx")
                return 2
            manifest = finish_from_onnx(args.from_onnx, args.target, args.workspace_gib)
            print(f"engines built with {args.target} {manifest['tensorrt']['version']} into {args.from_onnx}")
            return 0
        if args.output_path is None:
            logger.error("--output_path is required")
            return 2
        model_path = args.model_path
        if model_path is None:
            from devtools.demo_checkpoint.build import ensure_demo_checkpoint
            from serving.settings import DEMO_MODEL_DIR

            model_path = ensure_demo_checkpoint(DEMO_MODEL_DIR)
            logger.warning("no --model_path: building from the demo checkpoint (random weights)")
        options = BuildOptions(
            model_path=model_path, calib_images=args.calib_images, output_path=args.output_path,
            precision=args.precision, target=args.target, max_seq_len=args.max_seq_len, max_batch=args.max_batch,
            workspace_gib=args.workspace_gib, calibration_method=args.calibration_method,
            verify_tokens=args.verify_tokens, device=args.device, keep_fp32_onnx=args.keep_fp32_onnx,
            thresholds={"min_cosine": args.min_cosine, "min_token_agreement": args.min_token_agreement,
                        "max_kl": args.max_kl},
            command=command_line(),
        )  # fmt: skip
        manifest = build_bundle(options)
    except Exception as exc:  # every failure: one clear line, non-zero exit
        logger.debug("build failed", exc_info=True)
        logger.error("engine build failed: %s: %s", type(exc).__name__, exc)
        return 1
    accuracy = manifest["accuracy"]
    print(
        f"bundle ready: {args.output_path} ({manifest['precision']}, "
        f"engines: {manifest['tensorrt']['target'] or 'none, ONNX only'}); "
        f"embedding cosine {accuracy['image_embedding_cosine_min']:.4f}, "
        f"token agreement {accuracy['token_agreement_mean']:.2f}, first-token KL {accuracy['first_token_kl_max']:.2e}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
