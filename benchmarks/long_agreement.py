"""How far engine bundles agree with PyTorch on long multi-turn conversations: the precision table at several lengths.

    python -m benchmarks.long_agreement --model_path models/medgemma-demo --calib_images FILMS \
        --bundle int8=/tmp/b/int8 --bundle fp16=/tmp/b/fp16 --bundle fp32=/tmp/b/fp32 \
        --lengths 800,1600,2000 --tokens 32

For each length, one conversation about the first held-out film of --calib_images (the film the build's gate uses),
rounds of a question and a full read until the prompt has at least that many tokens (the build gate's own
conversation builder, so lengths land on round boundaries). Per bundle: free-running greedy agreement over
--tokens answer tokens, the identical prefix, and with PyTorch's answer fed to both (teacher forcing) the top-1
agreement and the largest and mean KL over every answer position. Bundles run on ONNX Runtime on the CPU, the
executor the build's gate uses where no GPU is. Prints a Markdown table; --json writes the figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def measure(reference, bundles: dict, film, lengths: list[int], tokens: int) -> list[dict]:
    from medgemma_xray.engine_build.verify import long_case_figures, long_conversation_request

    rows = []
    for wanted in lengths:
        first = next(iter(bundles.values()))
        request, length = long_conversation_request(
            film, wanted, tokens, first.prompt_ids, max_prompt_tokens=first.max_sequence - tokens
        )
        for name, bundle in bundles.items():
            started = time.perf_counter()
            figures = long_case_figures({"pytorch": reference, "bundle": bundle}, request, tokens)
            rows.append(
                {"bundle": name, "asked_tokens": wanted, "prompt_tokens": length, **figures}
                | {"seconds": round(time.perf_counter() - started, 1)}
            )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| bundle | prompt tokens | greedy agreement | identical prefix | top-1 agreement (fed) | largest KL | mean KL |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['bundle']} | {row['prompt_tokens']} | {row['token_agreement']:.2f} | {row['identical_prefix']} "
            f"| {row['top1_agreement']:.2f} | {row['kl_max']:.4f} | {row['kl_mean']:.5f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from medgemma_xray.engine_build.calibration import load_calibration_films, split_held_out
    from medgemma_xray.pytorch_backend.eager import TorchInference
    from medgemma_xray.trt_inference.trt_model import TRTInference

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", type=Path, required=True)
    parser.add_argument("--calib_images", type=Path, required=True, help="the films the bundles were built from")
    parser.add_argument("--bundle", action="append", default=[], help="name=folder, once per bundle")
    parser.add_argument("--lengths", default="800,1600,2000", help="prompt tokens to reach, comma-separated")
    parser.add_argument("--tokens", type=int, default=32, help="answer tokens compared")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    film = split_held_out(load_calibration_films(args.calib_images))[1][0]
    reference = TorchInference(args.model_path, device="cpu")
    bundles = {}
    try:
        for spec in args.bundle:
            name, folder = spec.split("=", 1)
            bundles[name] = TRTInference(folder, executor="onnxruntime-cpu", served_model=args.model_path)
        rows = measure(reference, bundles, film, [int(n) for n in args.lengths.split(",")], args.tokens)
    finally:
        for bundle in bundles.values():
            bundle.close()
        reference.close()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
