"""The gap a streaming client sees at a backend switch, against the gaps it sees at steady state.

    python -m benchmarks.switch_gaps --engine_path DIR --clients 8 --switches 10

The server runs with its default settings (scripts/start_gradio.sh --foreground, owned by benchmarks.supervisor);
only LOG_DIR, PORT, the upload cache's folder and ENGINE_PATH are set. CLIENTS clients stream answers through the
OpenAI API (the openai client, stream=True, each on its own film as a data: URL, 128 tokens an answer) without a
pause, while the service switches PyTorch -> bundle -> PyTorch ... SWITCHES times through scripts/switch_to_trt.sh
and switch_to_pytorch.sh, one switch every EVERY_S seconds after a steady start of the same length. Every chunk's
arrival is timed on the client.

A gap is the time between two chunks of one answer; the wait for an answer's first chunk (TTFT) is counted apart.
A gap or a wait is "at a switch" when it overlaps a switch (from the script's start to its exit, one second either
side); the rest are "steady". Reported: each class's p50, p99 and largest, the largest per switch, what each switch
script said (its load time and the interruption the service measured), answers that failed, and the host's load
average, because on a shared CPU the switch's loading competes with decoding for the same cores.

Written to OUTPUT/NAME.json and NAME.md (NAME defaults to DATE-switch-gaps).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
MARGIN_S = 1.0  # a gap this close to a switch counts as at the switch
ANSWER_TOKENS = 128


@dataclass
class Stream:
    """One answer as its client saw it: when it was asked, and when each chunk with text arrived."""

    client: int
    asked: float
    chunks: list[float] = field(default_factory=list)
    error: str = ""


@dataclass
class Switch:
    began: float
    ended: float
    to: str
    ok: bool
    said: str


def client_loop(index: int, url: str, film_url: str, stop: threading.Event, streams: list, lock) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="switch-gaps", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    question = f"Client {index}: describe the findings on this film in detail."
    messages = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": film_url}}, {"type": "text", "text": question}],
        }
    ]
    while not stop.is_set():
        stream = Stream(index, time.monotonic())
        try:
            for chunk in client.chat.completions.create(
                model=model, messages=messages, max_tokens=ANSWER_TOKENS, stream=True
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    stream.chunks.append(time.monotonic())
        except Exception as exc:  # recorded, not raised: the benchmark counts failed answers
            stream.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        with lock:
            streams.append(stream)
    client.close()


def run_switch(env: dict, to: str) -> Switch:
    began = time.monotonic()
    done = subprocess.run(
        [str(SCRIPTS / f"switch_to_{to}.sh")], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    said = (done.stdout + done.stderr).strip().splitlines()
    return Switch(began, time.monotonic(), to, done.returncode == 0, said[-1][:300] if said else "")


def _near(start: float, end: float, switches: list[Switch]) -> int | None:
    """The index of the switch the interval [start, end] overlaps (with the margin), or None."""
    for index, switch in enumerate(switches):
        if start <= switch.ended + MARGIN_S and end >= switch.began - MARGIN_S:
            return index
    return None


def _stats(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

    return {"count": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 1)}


def analyse(streams: list[Stream], switches: list[Switch]) -> dict:
    gaps: dict[str, list[float]] = {"steady": [], "switch": []}
    waits: dict[str, list[float]] = {"steady": [], "switch": []}
    per_switch: list[float] = [0.0] * len(switches)
    for stream in streams:
        if stream.error or not stream.chunks:
            continue
        first = stream.chunks[0]
        near = _near(stream.asked, first, switches)
        waits["steady" if near is None else "switch"].append(first - stream.asked)
        for a, b in zip(stream.chunks, stream.chunks[1:], strict=False):
            near = _near(a, b, switches)
            gaps["steady" if near is None else "switch"].append(b - a)
            if near is not None:
                per_switch[near] = max(per_switch[near], b - a)
    return {
        "gaps": {name: _stats(values) for name, values in gaps.items()},
        "ttft": {name: _stats(values) for name, values in waits.items()},
        "largest_gap_per_switch_ms": [round(v * 1000, 1) for v in per_switch],
        "answers": len(streams),
        "failed": [s.error for s in streams if s.error],
    }


def markdown(body: dict) -> str:
    result = body["result"]
    rows = [
        "| what | count | p50 (ms) | p99 (ms) | largest (ms) |",
        "|---|---|---|---|---|",
    ]
    for label, key, part in (
        ("gap between chunks, steady", "steady", "gaps"),
        ("gap between chunks, at a switch", "switch", "gaps"),
        ("wait for the first chunk, steady", "steady", "ttft"),
        ("wait for the first chunk, at a switch", "switch", "ttft"),
    ):
        s = result[part][key]
        rows.append(
            f"| {label} | {s['count']} | {s.get('p50_ms', '-')} | {s.get('p99_ms', '-')} | {s.get('max_ms', '-')} |"
        )
    switches = "\n".join(
        f"| {i + 1} | {s['to']} | {s['seconds']} | {'ok' if s['ok'] else 'FAILED'} | {gap} | {s['said']} |"
        for i, (s, gap) in enumerate(zip(body["switches"], result["largest_gap_per_switch_ms"], strict=True))
    )
    return (
        f"# Gaps a streaming client sees at a backend switch, {body['date']}\n\n"
        f"Machine: {body['machine']}; load average at start {body['load_start']}, at end {body['load_end']}.\n"
        f"Command: `{body['command']}`\n\n"
        f"{body['clients']} clients streaming {ANSWER_TOKENS}-token answers through the OpenAI API, "
        f"{len(body['switches'])} switches, {result['answers']} answers, {len(result['failed'])} failed.\n\n"
        + "\n".join(rows)
        + "\n\n| switch | to | script's run (s) | result | largest gap at it (ms) | what the script said |\n"
        "|---|---|---|---|---|---|\n" + switches + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine_path", type=Path, help="engine bundle to switch to (default: build the demo one)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--switches", type=int, default=10)
    parser.add_argument("--every-s", type=float, default=20.0)
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default=f"{datetime.date.today().isoformat()}-switch-gaps")
    args = parser.parse_args(argv)

    from benchmarks.soak import films
    from benchmarks.supervisor import Supervisor
    from devtools.loadtest import _free_port

    scratch = REPO_ROOT / "test-artifacts"
    scratch.mkdir(exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="switch-gaps-", dir=scratch))
    if args.engine_path is None:
        from benchmarks.soak_bundle import build_bundle

        args.engine_path = build_bundle(workdir)
    _, urls = films(workdir, args.clients)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LOG_DIR": str(workdir / "logs"),
        "PORT": str(port),
        "UPLOAD_CACHE_DIR": str(workdir / "upload-cache"),
        "ENGINE_PATH": str(args.engine_path.resolve()),
    }
    body: dict = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.switch_gaps " + shlex.join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.machine()}",
        "clients": args.clients,
        "load_start": round(os.getloadavg()[0], 1),
    }
    supervisor = Supervisor(env, url, workdir / "supervisor.log")
    streams: list[Stream] = []
    switches: list[Switch] = []
    lock = threading.Lock()
    stop = threading.Event()
    supervisor.start()
    try:
        threads = [
            threading.Thread(
                target=client_loop, args=(i, url, urls[i], stop, streams, lock), name=f"client-{i}", daemon=True
            )
            for i in range(args.clients)
        ]  # owned here: stopped by `stop` and joined below
        for thread in threads:
            thread.start()
        time.sleep(args.every_s)
        mode = "pytorch"
        for _ in range(args.switches):
            mode = "trt" if mode == "pytorch" else "pytorch"
            switches.append(run_switch(env, mode))
            time.sleep(args.every_s)
        stop.set()
        for thread in threads:
            thread.join(timeout=900)
    finally:
        stop.set()
        supervisor.stop()
    body["load_end"] = round(os.getloadavg()[0], 1)
    start = streams[0].asked if streams else time.monotonic()
    body["switches"] = [
        {
            "at_s": round(s.began - start, 1),
            "to": s.to,
            "seconds": round(s.ended - s.began, 2),
            "ok": s.ok,
            "said": s.said,
        }
        for s in switches
    ]
    body["result"] = analyse(streams, switches)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / f"{args.name}.json").write_text(json.dumps(body, indent=1))
    text = markdown(body)
    (args.output_dir / f"{args.name}.md").write_text(text)
    print(text)
    return 0 if all(s.ok for s in switches) and not body["result"]["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
