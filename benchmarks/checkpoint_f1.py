"""Demo checkpoints side by side on the same held-out phantoms: per-finding F1, macro-F1 and the wrong answers.

    python -m benchmarks.checkpoint_f1 --model before=CKPT_A --model now=CKPT_B \
        --phantoms 400 --start_seed 100 --device cuda

One hundred phantoms give 800 answers, where one answer moves macro-F1 by about 0.2 points: too few to tell two
checkpoints apart that differ by one answer. This asks every checkpoint the same questions about the same films in
one run, through the serving backend (real greedy generation), so a comparison on more phantoms is one command.
Writes the figures, the command, date and machine to benchmarks/results/<date>-checkpoint-f1.json.

Shards run as separate processes (one GPU holds many: each shard is one checkpoint on one range of seeds) and are
pooled afterwards, with a paired test of each two checkpoints on the questions they both answered:

    python -m benchmarks.checkpoint_f1 --merge SHARD.json [SHARD.json ...] --output POOLED.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
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


COUNTS = ("tp", "fp", "fn", "tn", "unparsed")


def pooled_finding(rows: list[dict]) -> dict:
    """One finding's counts summed over shards, with F1, precision and recall recomputed from the sums (the mean of
    the shards' F1s is not the F1 of their union)."""
    total = {key: sum(row[key] for row in rows) for key in COUNTS}
    tp, fp, fn, tn = total["tp"], total["fp"], total["fn"], total["tn"]
    return {
        "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0,
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / (tp + fn) if tp + fn else 0.0,
        "accuracy": (tp + tn) / (tp + fp + fn + tn),
        "support": tp + fn,
        "count": tp + fp + fn + tn,
        **total,
    }


def exact_mcnemar(only_a_wrong: int, only_b_wrong: int) -> float:
    """Two-sided exact McNemar test: under "the two checkpoints are equally good", each question that one gets
    wrong and the other right is a fair coin. The p-value of a split at least this uneven."""
    discordant = only_a_wrong + only_b_wrong
    if not discordant:
        return 1.0
    tail = sum(math.comb(discordant, k) for k in range(min(only_a_wrong, only_b_wrong) + 1)) / 2**discordant
    return min(1.0, 2 * tail)


def merge_shards(records: list[dict]) -> dict:
    """Pool checkpoint_f1 records by checkpoint name. Every checkpoint must cover the same seeds, each seed once,
    so that the paired comparison asks the same questions of both."""
    by_name: dict[str, list[tuple[str, dict]]] = {}
    for record in records:
        for name, result in record["checkpoints"].items():
            by_name.setdefault(name, []).append((record["seeds"], result))
    seeds = {name: sorted(s for s, _ in shards) for name, shards in by_name.items()}
    if len({tuple(s) for s in seeds.values()}) > 1:
        raise ValueError(f"checkpoints cover different seeds: {seeds}")
    for name, covered in seeds.items():
        if len(set(covered)) != len(covered):
            raise ValueError(f"{name}: a seed range appears twice: {covered}")
    pooled, wrong = {}, {}
    for name, shards in by_name.items():
        findings = list(shards[0][1]["per_finding"])
        per_finding = {f: pooled_finding([r["per_finding"][f] for _, r in shards]) for f in findings}
        wrong[name] = [w for _, r in shards for w in r["wrong_answers"]]
        pooled[name] = {
            "paths": sorted({r["path"] for _, r in shards}),
            "macro_f1": sum(row["f1"] for row in per_finding.values()) / len(per_finding),
            "answers": sum(row["count"] for row in per_finding.values()),
            "per_finding": per_finding,
            "wrong_answers": wrong[name],
        }
    names = list(pooled)
    paired = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            wrong_a = {(w["phantom"], w["finding"]) for w in wrong[a]}
            wrong_b = {(w["phantom"], w["finding"]) for w in wrong[b]}
            only_a, only_b = len(wrong_a - wrong_b), len(wrong_b - wrong_a)
            paired.append(
                {
                    "a": a,
                    "b": b,
                    "only_a_wrong": only_a,
                    "only_b_wrong": only_b,
                    "both_wrong": len(wrong_a & wrong_b),
                    "mcnemar_p": exact_mcnemar(only_a, only_b),
                }
            )
    return {"seeds": seeds[names[0]], "checkpoints": pooled, "paired": paired}


def merge_main(shard_paths: list[Path], output: Path, argv: list[str]) -> int:
    records = [json.loads(path.read_text()) for path in shard_paths]
    merged = merge_shards(records)
    merged = {
        "command": "python -m benchmarks.checkpoint_f1 " + " ".join(shlex.quote(a) for a in argv),
        "shard_commands": sorted({r["command"] for r in records}),
        "shard_dates_utc": sorted({r["date_utc"] for r in records}),
        "machine": records[0]["machine"],
        **merged,
    }
    print("| checkpoint | macro-F1 | wrong answers |\n|---|---|---|")
    for name, result in merged["checkpoints"].items():
        print(f"| {name} | {result['macro_f1']:.5f} | {len(result['wrong_answers'])} of {result['answers']} |")
    print("\n| a | b | only a wrong | only b wrong | both | exact McNemar p |\n|---|---|---|---|---|---|")
    for row in merged["paired"]:
        print(
            f"| {row['a']} | {row['b']} | {row['only_a_wrong']} | {row['only_b_wrong']} | {row['both_wrong']} "
            f"| {row['mcnemar_p']:.3f} |"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(merged, indent=2, default=str) + "\n")
    print(f"written to {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--merge":
        merge = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_f1 --merge")
        merge.add_argument("shards", type=Path, nargs="+")
        merge.add_argument("--output", type=Path, required=True)
        merged_args = merge.parse_args(argv[1:])
        return merge_main(merged_args.shards, merged_args.output, argv)
    return measure_main(argv)


def measure_main(argv: list[str]) -> int:
    from medgemma_xray.phantoms.evaluation import format_table, held_out_phantoms, task_accuracy
    from medgemma_xray.pytorch_backend.eager import TorchInference

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
