"""The class-load table (issue 35's rows) from benchmark.py JSON files run side by side: before and after, bf16 and
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
        busy = _get(level, "gpu_busy", "busy_fraction_of_window")
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
            busy = _get(record, "gpu_busy", "busy_fraction_of_window")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    before, after = json.loads(args.before.read_text()), json.loads(args.after.read_text())
    text = (
        f"Machine: {_get(after, 'machine', 'device') or _get(after, 'machine')} · after: {after.get('date')} · "
        f"before: {before.get('date')}\n\nCommand (after): `{after.get('command')}`\n\n{table(before, after)}\n"
    )
    if args.output:
        args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
