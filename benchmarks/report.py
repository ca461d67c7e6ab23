"""The benchmark's outputs: a Markdown table for stdout and the README, the JSON record, and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(result: dict) -> str:
    modes = result["modes"]
    lines = [
        f"Machine: {result['machine']['device']} · model: {result['model']} · date: {result['date']}",
        f"Command: `{result['command']}`",
        "",
        f"| mode | start-up s | TTFT p50 ms | decode ms/token p50 | {result['settings'].get('answer_tokens', '?')}-token "
        "answer p50 s | p99 s | peak GPU GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, mode in modes.items():
        if "error" in mode:
            lines.append(f"| {name} | not run: {mode['error']} | | | | | |")
            continue
        single = mode.get("single_stream", {})
        lines.append(
            f"| {name} | {_fmt(mode['startup'].get('total_s'))} | {_fmt(single.get('ttft_ms', {}).get('p50'))} | "
            f"{_fmt(single.get('decode_ms_per_token', {}).get('p50'), 2)} | "
            f"{_fmt(single.get('end_to_end_s', {}).get('p50'), 3)} | {_fmt(single.get('end_to_end_s', {}).get('p99'), 3)} | "
            f"{_fmt(mode.get('peak_gpu_gib'), 2)} |"
        )
    lines += [
        "",
        "| mode | users | answers | failures | tokens/s | requests/s | per-stream ms/token p50 | TTFT p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, mode in modes.items():
        for level in mode.get("concurrency", []):
            lines.append(
                f"| {name} | {level['users']} | {level['answers']} | {level['failures']} | {_fmt(level['tokens_per_s'])} | "
                f"{_fmt(level['requests_per_s'], 2)} | {_fmt(level['per_stream_ms_per_token'].get('p50'), 2)} | "
                f"{_fmt(level['ttft_ms'].get('p50'))} / {_fmt(level['ttft_ms'].get('p99'))} |"
            )
    lines += ["", "| mode | conversation | turns | total s | follow-up TTFT p50 ms |", "|---|---|---|---|---|"]
    for name, mode in modes.items():
        for run in mode.get("conversation", []):
            label = "KV kept between turns" if run["kv_reuse"] else "re-prefilled every turn"
            lines.append(
                f"| {name} | {label} | {run['turns']} | {_fmt(run['total_s'], 2)} | "
                f"{_fmt(run['follow_up_ttft_ms'].get('p50'))} |"
            )
    lines += ["", "| mode | films | features s | reports s | end to end s | films/s |", "|---|---|---|---|---|---|"]
    for name, mode in modes.items():
        batch = mode.get("film_batch")
        if batch:
            lines.append(
                f"| {name} | {batch['films']} | {_fmt(batch['features_s'], 2)} | {_fmt(batch['reports_s'], 2)} | "
                f"{_fmt(batch['end_to_end_s'], 2)} | {_fmt(batch['films_per_s'], 2)} |"
            )
    scored = {name: mode["task_accuracy"] for name, mode in modes.items() if mode.get("task_accuracy")}
    if scored:
        from medgemma_xray.phantoms.evaluation import format_table

        first = next(iter(scored.values()))
        lines += [
            "",
            f"Task accuracy on {first['phantoms']} held-out phantoms (seeds {first['seeds'][0]}-"
            f"{first['seeds'][1]}), per-finding F1:",
            "",
            format_table(scored),
        ]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Aggregate tokens/s and per-stream ms/token against users, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (throughput, latency) = pyplot.subplots(1, 2, figsize=(11, 4))
    for name, mode in result["modes"].items():
        levels = mode.get("concurrency") or []
        if not levels:
            continue
        users = [level["users"] for level in levels]
        throughput.plot(users, [level["tokens_per_s"] for level in levels], marker="o", label=name)
        latency.plot(users, [level["per_stream_ms_per_token"].get("p50") for level in levels], marker="o", label=name)
    for axis, title in ((throughput, "tokens/s, all users"), (latency, "ms/token per stream (p50)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent users")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
        axis.legend()
    figure.suptitle(f"{result['model']} on {result['machine']['device']} ({result['date']})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def write(result: dict, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"json": folder / "benchmark.json", "markdown": folder / "benchmark.md", "plot": folder / "benchmark.png"}
    paths["json"].write_text(json.dumps(result, indent=2, default=str) + "\n")
    paths["markdown"].write_text(markdown(result))
    plot(result, paths["plot"])
    return paths
