"""The class-load table from benchmark.py JSON files run side by side: before and after, bf16 and
int8 weights, with the targets and how far each figure is from its target; and a plot of the rows that have one.

  python3 -m benchmarks.gpu_busy_report before.json after.json --output report.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODES = ("pytorch-fast", "pytorch-fast-int8")


def _get(record: dict, *path):
    for key in path:
        if record is None:
            return None
        if isinstance(key, int):
            record = record[key] if isinstance(record, list) and len(record) > key else None
        else:
            record = record.get(key) if isinstance(record, dict) else None
    return record


def _level(mode: dict, key: str, field: str, value: int) -> dict | None:
    for row in mode.get(key) or []:
        if row.get(field) == value:
            return row
    return None


def _fmt(value, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def rows(mode: dict) -> list[tuple[str, str, float | None, str]]:
    """(row, figure as shown, the number a target compares, target) for one mode's record."""
    out = []
    single = mode.get("single_stream") or {}
    out.append(
        (
            "1 user: ms/token, TTFT ms, 128-token answer s",
            f"{_fmt(_get(single, 'decode_ms_per_token', 'p50'), 2)}, {_fmt(_get(single, 'ttft_ms', 'p50'), 1)}, "
            f"{_fmt(_get(single, 'end_to_end_s', 'p50'), 3)}",
            _get(single, "decode_ms_per_token", "p50"),
            "–",
        )
    )
    for users, target in ((16, "≥ 4,000 bf16 / ≥ 5,000 int8; ≤ 4 ms/token"), (48, "–"), (64, "≥ 8,000; p99 ≤ 500")):
        level = _level(mode, "concurrency", "users", users) or {}
        busy = _get(level, "gpu_busy", "busy_fraction") or _get(level, "gpu_busy", "busy_fraction_of_span")
        out.append(
            (
                f"{users} users: tokens/s, per-stream ms/token, TTFT p99 ms, GPU busy",
                f"{_fmt(level.get('tokens_per_s'))}, {_fmt(_get(level, 'per_stream_ms_per_token', 'p50'), 2)}, "
                f"{_fmt(_get(level, 'ttft_ms', 'p99'))}, {_fmt(busy * 100 if busy is not None else None)} %",
                level.get("tokens_per_s"),
                target + ("; busy ≥ 85 %" if users in (16, 48) else ""),
            )
        )
    kept = _get(mode, "conversation", 1, "follow_up_ttft_ms", "p50")
    again = _get(mode, "conversation", 0, "follow_up_ttft_ms", "p50")
    out.append(
        ("5 turns: follow-up TTFT ms, KV kept / re-prefilled", f"{_fmt(kept, 1)} / {_fmt(again, 1)}", kept, "≤ 15")
    )
    films = mode.get("film_batch") or {}
    out.append(
        ("100 films, 128-token reports: s", _fmt(films.get("end_to_end_s"), 1), films.get("end_to_end_s"), "≤ 5")
    )
    for key, label in (("teaching_round", "own films"), ("class_on_one_film", "one film")):
        for record in mode.get(key) or []:
            students = record.get("students")
            busy = _get(record, "gpu_busy", "busy_fraction") or _get(record, "gpu_busy", "busy_fraction_of_span")
            first = record.get("first_answer_ttft_ms") or {}
            follow = record.get("follow_up_ttft_ms") or {}
            target = {48: "first p95 ≤ 300, follow-up p95 ≤ 100, ≤ 6 ms/token"}.get(students, "–")
            if key == "class_on_one_film" and students == 48:
                target = "first p95 ≤ 150"
            out.append(
                (
                    f"teaching round, {students} students, {label}: first TTFT p50/p95, follow-up p50/p95 ms; "
                    "ms/token p50; GPU busy",
                    f"{_fmt(first.get('p50'))}/{_fmt(first.get('p95'))}, {_fmt(follow.get('p50'))}/"
                    f"{_fmt(follow.get('p95'))}; {_fmt(_get(record, 'per_stream_ms_per_token', 'p50'), 2)}; "
                    f"{_fmt(busy * 100 if busy is not None else None)} %",
                    first.get("p95"),
                    target,
                )
            )
    out.append(("start-up s", _fmt(_get(mode, "startup", "total_s"), 1), _get(mode, "startup", "total_s"), "–"))
    return out


def table(before: dict, after: dict) -> str:
    modes = [mode for mode in MODES if mode in after.get("modes", {}) or mode in before.get("modes", {})]
    header = "| row | " + " | ".join(f"{m} before | {m} after" for m in modes) + " | target |"
    lines = [header, "|---" * (2 + 2 * len(modes)) + "|"]
    per_mode = {}
    for mode in modes:
        per_mode[mode] = (
            rows(_get(before, "modes", mode) or {}),
            rows(_get(after, "modes", mode) or {}),
        )
    names = [name for name, _, _, _ in per_mode[modes[0]][1]]
    for index, name in enumerate(names):
        cells = []
        target = "–"
        for mode in modes:
            old, new = per_mode[mode]
            cells.append(old[index][1] if index < len(old) else "–")
            cells.append(new[index][1] if index < len(new) else "–")
            target = new[index][3] if index < len(new) else target
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {target} |")
    return "\n".join(lines)


def plot(pairs: dict[str, tuple[dict, dict]], path: Path) -> None:
    """Throughput by users and teaching-round TTFT p95, before and after, per mode: one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.2
    for index, (mode, (before, after)) in enumerate(pairs.items()):
        for shift, (label, record) in enumerate((("before", before), ("after", after))):
            levels = (_get(record, "modes", mode, "concurrency") or [])[1:]
            xs = [i + (2 * index + shift) * width for i in range(len(levels))]
            left.bar(xs, [row.get("tokens_per_s") or 0 for row in levels], width, label=f"{mode} {label}")
            left.set_xticks([i + 1.5 * width for i in range(len(levels))], [str(row["users"]) for row in levels])
            rounds = (_get(record, "modes", mode, "teaching_round") or []) + (
                _get(record, "modes", mode, "class_on_one_film") or []
            )
            xs = [i + (2 * index + shift) * width for i in range(len(rounds))]
            right.bar(xs, [_get(r, "first_answer_ttft_ms", "p95") or 0 for r in rounds], width, label=f"{mode} {label}")
            right.set_xticks(
                [i + 1.5 * width for i in range(len(rounds))],
                [f"{r['students']}{' one film' if r.get('one_film') else ''}" for r in rounds],
            )
    left.set_title("tokens/s by concurrent users")
    right.set_title("teaching round: first-answer TTFT p95 (ms)")
    left.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--plot", type=Path, help="also draw the before/after PNG here (matplotlib)")
    args = parser.parse_args(argv)
    before, after = json.loads(args.before.read_text()), json.loads(args.after.read_text())
    text = (
        f"Machine: {_get(after, 'machine', 'device') or _get(after, 'machine')} · after: {after.get('date')} · "
        f"before: {before.get('date')}\n\nCommand (after): `{after.get('command')}`\n\n{table(before, after)}\n"
    )
    if args.output:
        args.output.write_text(text)
    if args.plot:
        modes = [m for m in MODES if m in after.get("modes", {})]
        plot({m: (before, after) for m in modes}, args.plot)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
