"""The demo model's pointing and comparing on held-out phantoms, beside its finding F1: the issue-39 table.

    python -m benchmarks.grounding_accuracy --model_path src/medgemma_xray/demo_model/trained \
        --phantoms 100 --pairs 100 --device cpu

Through the PyTorch backend (any InferenceBackend works with phantoms.grounding_eval): localisation IoU (mean,
median) and hit rate at IoU >= 0.3 and >= 0.5 per finding; change-detection accuracy on progression pairs (prior
and current film in one request); the per-finding F1 and macro-F1 of phantoms.evaluation. Prints the tables and
writes everything, with the command, date and machine, to benchmarks/results/<date>-grounding-accuracy.json.
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


def main(argv: list[str] | None = None) -> int:
    from medgemma_xray.phantoms.evaluation import format_table, held_out_phantoms, task_accuracy
    from medgemma_xray.phantoms.grounding_eval import (
        change_detection_accuracy,
        format_change_table,
        format_localisation_table,
        grounding_phantoms,
        held_out_pairs,
        localisation_accuracy,
    )
    from medgemma_xray.pytorch_backend.eager import TorchInference

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", type=Path, required=True)
    parser.add_argument("--phantoms", type=int, default=100, help="held-out films for localisation and F1")
    parser.add_argument("--pairs", type=int, default=100, help="held-out progression pairs")
    parser.add_argument("--start_seed", type=int, default=0, help="first held-out seed (films and pairs)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", type=Path, default=None, help="JSON file (default: benchmarks/results/...)")
    parser.add_argument("--skip_f1", action="store_true", help="leave out the finding F1 (it has its own table)")
    args = parser.parse_args(argv)

    backend = TorchInference(args.model_path, device=args.device)
    seconds = {}
    try:
        started = time.perf_counter()
        localisation = localisation_accuracy(backend, grounding_phantoms(args.phantoms, args.start_seed))
        seconds["localisation"] = time.perf_counter() - started
        started = time.perf_counter()
        changes = change_detection_accuracy(backend, held_out_pairs(args.pairs, args.start_seed))
        seconds["change_detection"] = time.perf_counter() - started
        f1 = None
        if not args.skip_f1:
            started = time.perf_counter()
            f1 = task_accuracy(backend, held_out_phantoms(args.phantoms, args.start_seed), share_film_prefix=True)
            seconds["f1"] = time.perf_counter() - started
        info = backend.info()
    finally:
        backend.close()

    print("Localisation (held-out phantoms)\n")
    print(format_localisation_table(localisation))
    print("\nChange detection (held-out progression pairs)\n")
    print(format_change_table(changes))
    if f1 is not None:
        print("\nFinding F1 (held-out phantoms)\n")
        print(format_table({"pytorch": f1}))
    print("\nwall time: " + ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items()))

    today = datetime.datetime.now(datetime.UTC)
    record = {
        "command": "python -m benchmarks.grounding_accuracy " + " ".join(shlex.quote(a) for a in argv),
        "date_utc": today.isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "device": args.device},
        "model": {"path": str(args.model_path), "name": getattr(info, "model_id", None)},
        "seeds": f"{args.start_seed}..{args.start_seed + max(args.phantoms, args.pairs) - 1}",
        "localisation": localisation,
        "change_detection": changes,
        "finding_f1": f1,
        "wall_s": {name: round(s, 1) for name, s in seconds.items()},
    }
    output = args.output or RESULTS / f"{today:%Y-%m-%d}-grounding-accuracy.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"written to {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
