"""Demo checkpoints side by side on the same held-out phantoms: per-finding F1, macro-F1 and the wrong answers.

    python -m benchmarks.checkpoint_f1 --model before=CKPT_A --model now=CKPT_B \
        --phantoms 400 --start_seed 100 --device cuda

One hundred phantoms give 800 answers, where one answer moves macro-F1 by about 0.2 points: too few to tell two
checkpoints apart that differ by one answer. This asks every checkpoint the same questions about the same films in
one run, through the serving backend (real greedy generation), so a comparison on more phantoms is one command.
Writes the figures, the command, date and machine to benchmarks/results/<date>-checkpoint-f1.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def named_path(text: str) -> tuple[str, Path]:
    name, separator, path = text.partition("=")
    if not separator or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    from medgemma_xray.phantoms.evaluation import format_table, held_out_phantoms, task_accuracy
    from medgemma_xray.pytorch_backend.eager import TorchInference

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=named_path, action="append", required=True, help="NAME=PATH (repeat)")
    parser.add_argument("--phantoms", type=int, default=100)
    parser.add_argument("--start_seed", type=int, default=0, help="first held-out seed (held-out seeds are < 1e6)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", type=Path, default=None, help="JSON file (default: benchmarks/results/...)")
    args = parser.parse_args(argv)

    phantoms = held_out_phantoms(args.phantoms, start_seed=args.start_seed)
    results, wall = {}, {}
    for name, path in args.model:
        backend = TorchInference(path, device=args.device)
        try:
            started = time.perf_counter()
            results[name] = task_accuracy(backend, phantoms)
            wall[name] = round(time.perf_counter() - started, 1)
        finally:
            backend.close()
    print(format_table(results))
    print("\n| checkpoint | macro-F1 | wrong answers | which |\n|---|---|---|---|")
    for name, result in results.items():
        wrong = [a for a in result["answers"] if not a["correct"]]
        which = ", ".join(f"{a['phantom'].removeprefix('phantom-')} {a['finding']}" for a in wrong)
        print(f"| {name} | {result['macro_f1']:.5f} | {len(wrong)} of {len(result['answers'])} | {which} |")

    today = datetime.datetime.now(datetime.UTC)
    record = {
        "command": "python -m benchmarks.checkpoint_f1 " + " ".join(shlex.quote(a) for a in argv),
        "date_utc": today.isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "device": args.device},
        "seeds": f"{args.start_seed}..{args.start_seed + args.phantoms - 1}",
        "checkpoints": {
            name: {
                "path": str(path),
                "macro_f1": results[name]["macro_f1"],
                "per_finding": results[name]["per_finding"],
                "wrong_answers": [a for a in results[name]["answers"] if not a["correct"]],
                "wall_s": wall[name],
            }
            for name, path in args.model
        },
    }
    output = args.output or RESULTS / f"{today:%Y-%m-%d}-checkpoint-f1.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"written to {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
