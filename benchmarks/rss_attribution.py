"""Where a soak's RSS growth goes: the soak's load (benchmarks/soak.py, without its faults) against a server that
samples its own memory by layer (devtools/rss_probe.py), then one slope per layer over the window after warm-up.

    python -m benchmarks.rss_attribution --minutes 15 --no-switch --output /tmp/attr
    python -m benchmarks.rss_attribution --minutes 15 --engine_path BUNDLE --tracemalloc-frames 8 --output /tmp/attr

Reading the table: if `traced` (tracemalloc: Python's own allocations) grows like RSS, the diff files name the
lines; if `malloc_in_use` grows but `traced` does not, a native library keeps blocks; if `malloc_free_in_heap`
grows, glibc keeps freed memory (fragmentation, per-thread arenas: see `arenas`); if none grows but Anonymous
does, the growth is outside malloc (a library's own mmap, thread stacks: see `threads`).
tracemalloc slows the server (about 1.5-2x with 8 frames) and costs memory of its own; run without it first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SITECUSTOMIZE = "from devtools.rss_probe import start_from_env\nstart_from_env()\n"
COLUMNS = (
    "smaps_Rss",
    "smaps_Anonymous",
    "smaps_Private_Dirty",
    "malloc_in_use",
    "malloc_mmapped",
    "malloc_heap",
    "malloc_free_in_heap",
    "traced",
    "py_blocks",
    "threads",
    "arenas",
)
BYTE_COLUMNS = {c for c in COLUMNS if c.startswith(("smaps", "malloc")) or c == "traced"}


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope, per minute."""
    if len(points) < 3:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    den = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / den * 60 if den else None


def attribution(rows: list[dict], warmup_s: float) -> list[dict]:
    """Per server process: each column's first and last value after warm-up and its slope per minute (MiB for
    bytes, a count otherwise)."""
    out = []
    for pid in sorted({r["pid"] for r in rows}):
        mine = [r for r in rows if r["pid"] == pid and (r.get("since_ready") or -1) >= warmup_s]
        for column in COLUMNS:
            points = [(r["s"], r[column]) for r in mine if r.get(column) is not None]
            if not points:
                continue
            scale = 1 / (1 << 20) if column in BYTE_COLUMNS else 1
            per_min = slope(points)
            out.append(
                {
                    "pid": pid,
                    "column": column,
                    "first": round(points[0][1] * scale, 1),
                    "last": round(points[-1][1] * scale, 1),
                    "per_min": None if per_min is None else round(per_min * scale, 3),
                    "minutes": round((points[-1][0] - points[0][0]) / 60, 1),
                }
            )
    return out


PHASE_COLUMNS = ("smaps_Rss", "smaps_Anonymous", "malloc_heap", "malloc_free_in_heap", "malloc_in_use")


def phases(rows: list[dict], switches: list[dict], warmup_s: float) -> list[dict]:
    """Per backend phase (between the soak's switches) of the last server process: each layer's median over the
    phase's second half, in MiB. The second half, because a phase's first minutes still carry the switch's
    transients. Switch times are the soak's, samples the probe's: both count from within a second of the server's
    start, which is far below a phase's length."""
    if not rows:
        return []
    last = rows[-1]["pid"]
    mine = [r for r in rows if r["pid"] == last and (r.get("since_ready") or -1) >= warmup_s]
    if not mine:
        return []
    ends = [float(s["at_s"]) for s in switches if s.get("ok")] + [mine[-1]["s"] + 1]
    starts = [mine[0]["s"]] + ends[:-1]
    backends = ["pytorch"] + [s["to"] for s in switches if s.get("ok")]
    out = []
    for start, end, backend in zip(starts, ends, backends, strict=True):
        start = max(start, mine[0]["s"])
        half = [r for r in mine if (start + end) / 2 <= r["s"] < end]
        if end <= start or not half:
            continue
        row = {"from_min": round(start / 60, 1), "to_min": round(end / 60, 1), "backend": backend}
        for column in PHASE_COLUMNS:
            values = sorted(r[column] for r in half if r.get(column) is not None)
            row[column] = round(values[len(values) // 2] / (1 << 20), 1) if values else None
        out.append(row)
    return out


def phase_table(result: list[dict]) -> str:
    lines = ["| minutes | backend | " + " | ".join(PHASE_COLUMNS) + " |", "|---|---|" + "---|" * len(PHASE_COLUMNS)]
    lines += [
        f"| {r['from_min']}-{r['to_min']} | {r['backend']} | " + " | ".join(str(r[c]) for c in PHASE_COLUMNS) + " |"
        for r in result
    ]
    return "\n".join(lines)


def table(result: list[dict]) -> str:
    lines = ["| pid | layer | first | last | slope per min | over min |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['pid']} | {r['column']} | {r['first']} | {r['last']} | {r['per_min']} | {r['minutes']} |" for r in result
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--output", type=Path, required=True, help="folder for samples, diffs and the soak files")
    parser.add_argument("--warmup-min", type=float, default=3)
    parser.add_argument("--snapshot-every-s", type=float, default=120)
    parser.add_argument("--tracemalloc-frames", type=int, default=0, help="0: tracemalloc off")
    parser.add_argument(
        "--collect", action="store_true", help="gc.collect() at each snapshot, recording what it freed (alters the run)"
    )
    parser.add_argument("--chase", default="", help="types (module.qualname, commas) whose holders to print")
    parser.add_argument("--engine_path", type=Path, help="switch to this bundle every 5 minutes (else PyTorch only)")
    parser.add_argument("--report-only", action="store_true", help="summarise OUTPUT/samples.jsonl again")
    parser.add_argument("soak_args", nargs="*", help="more arguments for benchmarks.soak, after --")
    args = parser.parse_args(argv)
    output = args.output.resolve()
    if not args.report_only:
        output.mkdir(parents=True, exist_ok=True)
        site = output / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        path = [str(site), str(REPO_ROOT), str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            "RSS_PROBE_DIR": str(output),
            "RSS_PROBE_TRACEMALLOC_FRAMES": str(args.tracemalloc_frames),
            "RSS_PROBE_WARMUP_S": str(args.warmup_min * 60),
            "RSS_PROBE_SNAPSHOT_S": str(args.snapshot_every_s),
            "RSS_PROBE_COLLECT": "1" if args.collect else "0",
            "RSS_PROBE_CHASE": args.chase,
        }
        soak = [sys.executable, "-m", "benchmarks.soak", "--minutes", str(args.minutes), "--no-faults"]
        soak += ["--engine_path", str(args.engine_path)] if args.engine_path else ["--no-switch"]
        soak += ["--output-dir", str(output), "--name", "soak", *args.soak_args]
        subprocess.run(soak, env=env, cwd=REPO_ROOT, check=False)
    rows = [json.loads(line) for line in (output / "samples.jsonl").read_text().splitlines() if line.strip()]
    result = attribution(rows, args.warmup_min * 60)
    (output / "attribution.json").write_text(json.dumps(result, indent=1))
    text = table(result)
    soak_file = output / "soak.json"
    if soak_file.exists():  # medians per backend phase: what a switch keeps, layer by layer
        by_phase = phases(rows, json.loads(soak_file.read_text()).get("switches", []), args.warmup_min * 60)
        (output / "phases.json").write_text(json.dumps(by_phase, indent=1))
        text += "\n\nMedians over the second half of each phase, MiB (last server process):\n\n" + phase_table(by_phase)
    (output / "attribution.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
