"""Which decoder layers can take INT8 activations: a per-layer sensitivity sweep on the long conversation.

    python -m benchmarks.int8_sensitivity --model_path models/medgemma-demo --calib_images FILMS \
        --bundle BUNDLE --lengths 1578,2000 --output benchmarks/results/DATE-int8-sensitivity.json

BUNDLE: an int8 bundle built with --keep_fp32_onnx (its fp32 decoder is the starting point). Each variant rewrites
the decoder with the build's own quantize_graph and is compared with PyTorch on the build gate's long conversation
(benchmarks.long_agreement's figures: free-running greedy agreement, and over PyTorch's fed answer the top-1
agreement and the largest and mean KL):

- fp32: the exported decoder (the floor);
- weight-only: every projection weight-only INT8 (the build's default);
- w8a8-all: ModelOpt's W8A8 on every projection (the build's INT8 before weight-only);
- w8a8-GROUP: ModelOpt's W8A8 on one layer's attention or MLP projections, weight-only elsewhere.

A group whose largest KL stays under the gate's --max_long_kl is a candidate for --int8_w8a8_layers; the build's
gate still judges the combination.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path


def variants(layers: int) -> dict[str, tuple[str, ...] | None]:
    """name -> W8A8 groups (None: the fp32 decoder)."""
    table: dict[str, tuple[str, ...] | None] = {"fp32": None, "weight-only": ()}
    every = tuple(f"layers.{layer}/{part}" for layer in range(layers) for part in ("self_attn", "mlp"))
    table["w8a8-all"] = every
    for group in every:
        table[f"w8a8-{group}"] = (group,)
    return table


def main(argv: list[str] | None = None) -> int:
    from benchmarks.long_agreement import measure, table
    from medgemma_xray.engine_build.calibration import (
        FeedReader,
        load_calibration_films,
        record_decoder_feeds,
        split_held_out,
    )
    from medgemma_xray.engine_build.quantize import quantize_graph
    from medgemma_xray.engine_bundle.manifest import read_manifest
    from medgemma_xray.pytorch_backend.eager import TorchInference
    from medgemma_xray.trt_inference.trt_model import TRTInference

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", type=Path, required=True)
    parser.add_argument("--calib_images", type=Path, required=True)
    parser.add_argument("--bundle", type=Path, required=True, help="an int8 bundle built with --keep_fp32_onnx")
    parser.add_argument("--lengths", default="1578,2000")
    parser.add_argument("--tokens", type=int, default=16, help="answer tokens compared (the gate's --verify_tokens)")
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--output", type=Path, help="write the figures here (JSON)")
    args = parser.parse_args(argv)

    manifest = read_manifest(args.bundle)
    fp32_decoder = args.bundle / "onnx" / "fp32" / "decoder.onnx"
    if not fp32_decoder.is_file():
        parser.error(f"{args.bundle} has no onnx/fp32/decoder.onnx: build it with --keep_fp32_onnx")
    calibration, held_out = split_held_out(load_calibration_films(args.calib_images))
    chosen = variants(manifest["shapes"]["layers"])
    if args.only:
        chosen = {name: groups for name, groups in chosen.items() if name in args.only.split(",")}
    reference = TorchInference(args.model_path, device="cpu")
    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-sensitivity-") as scratch:
        work = Path(scratch) / "bundle"
        shutil.copytree(args.bundle, work)
        decoder = work / manifest["graphs"]["decoder"]["onnx"]
        shutil.copyfile(fp32_decoder, decoder)  # ModelOpt's calibration feeds come from the fp32 decoder
        recorder = TRTInference(work, executor="onnxruntime-cpu", require_verified=False)
        feeds, _ = record_decoder_feeds(recorder, calibration, 4)
        recorder.close()
        for name, groups in chosen.items():
            if groups is None:
                shutil.copyfile(fp32_decoder, decoder)
            else:
                quantize_graph("decoder", fp32_decoder, decoder, "int8", FeedReader(feeds), w8a8_layers=groups)
            bundle = TRTInference(work, executor="onnxruntime-cpu", require_verified=False)
            try:
                found = measure(
                    reference, {name: bundle}, held_out[0], [int(n) for n in args.lengths.split(",")], args.tokens
                )
            finally:
                bundle.close()
            rows += found
            print(table(found).splitlines()[-1], flush=True)
    reference.close()
    print(table(rows))
    if args.output:
        args.output.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
