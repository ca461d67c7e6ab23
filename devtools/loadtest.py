"""Loopback load test: many clients upload a film and ask about it for a bounded time, while the mode may flip,
and the server's memory is watched. Used by tests/scripts/test_load.py (short) and by hand (long):

    python -m devtools.loadtest --clients 16 --seconds 600 --switch-every 20 --engine_path DIR \
        --max-new-tokens 16 --output test-artifacts/load-long.json

The CLI starts its own server through scripts/start_gradio.sh (own LOG_DIR, free port), runs the load, stops it,
prints a table and writes the figures as JSON. Switching uses the operator scripts, without KEEP_BOTH_BACKENDS, so
the TensorRT backend is closed after every switch back while answers still run on it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for PID {pid}")


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_s": None, "p90_s": None, "p99_s": None, "max_s": None}
    ordered = sorted(values)
    cuts = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    return {"p50_s": cuts[49], "p90_s": cuts[89], "p99_s": cuts[98], "max_s": ordered[-1]}


@dataclass
class LoadResult:
    clients: int
    seconds: float
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    per_client: list[int] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    switches: list[dict] = field(default_factory=list)
    rss_samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, bytes)

    def summary(self) -> dict:
        rss = [value for _, value in self.rss_samples]
        return {
            "clients": self.clients,
            "seconds": round(self.seconds, 1),
            "answered": self.answered,
            "failed": len(self.failures),
            "answers_per_s": round(self.answered / self.seconds, 2),
            **{
                key: (round(value, 3) if value is not None else None)
                for key, value in percentiles(self.latencies_s).items()
            },
            "switches": len(self.switches),
            "rss_start_mib": round(rss[0] / 2**20, 1) if rss else None,
            "rss_end_mib": round(rss[-1] / 2**20, 1) if rss else None,
            "rss_max_mib": round(max(rss) / 2**20, 1) if rss else None,
        }

    def to_json(self) -> dict:
        return {"summary": self.summary(), **asdict(self)}


def run_load(
    url: str,
    film: Path,
    clients: int,
    seconds: float,
    server_pid: int,
    switch: Callable[[str], dict] | None = None,
    switch_every_s: float = 0.0,
) -> LoadResult:
    """Every client loops new case -> upload -> ask until the deadline; a request under way is always finished
    (so every request sent gets its answer or counts as a failure). `switch(mode)` flips the mode meanwhile."""
    from gradio_client import Client, handle_file

    result = LoadResult(clients=clients, seconds=seconds, per_client=[0] * clients)
    lock = threading.Lock()
    connected = [Client(url, verbose=False) for _ in range(clients)]  # before the clock: config fetches are slow
    started = time.monotonic()
    deadline = started + seconds
    result.rss_samples.append((0.0, rss_bytes(server_pid)))

    def client_loop(index: int) -> None:
        client = connected[index]
        while time.monotonic() < deadline:
            try:
                client.predict(api_name="/new_case")
                client.predict(handle_file(str(film)), api_name="/upload_film")
                asked = time.perf_counter()
                chat = client.predict(f"Client {index}: findings?", api_name="/ask")[0]
                if chat[-1]["role"] != "assistant":
                    raise AssertionError(f"no answer: {chat[-1]}")
                with lock:
                    result.latencies_s.append(time.perf_counter() - asked)
                    result.answered += 1
                    result.per_client[index] += 1
            except Exception as exc:  # counted: the caller asserts there are none
                with lock:
                    result.failures.append(f"client {index}: {exc!r}"[:400])

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    mode, next_switch, next_sample = "pytorch", started + switch_every_s, started + 1.0
    while any(thread.is_alive() for thread in threads):
        now = time.monotonic()
        if now >= next_sample:
            result.rss_samples.append((round(now - started, 1), rss_bytes(server_pid)))
            next_sample = now + 1.0
        if switch is not None and switch_every_s > 0 and now >= next_switch and now < deadline - switch_every_s / 2:
            mode = "trt" if mode == "pytorch" else "pytorch"
            result.switches.append({"at_s": round(now - started, 1), "to": mode, **switch(mode)})
            next_switch = time.monotonic() + switch_every_s
        time.sleep(0.1)
    if switch is not None and mode != "pytorch":  # end on PyTorch: TensorRT closed, so its memory must be back
        result.switches.append({"at_s": round(time.monotonic() - started, 1), "to": "pytorch", **switch("pytorch")})
    time.sleep(1.0)
    result.rss_samples.append((round(time.monotonic() - started, 1), rss_bytes(server_pid)))
    result.seconds = time.monotonic() - started
    return result


def format_table(summary: dict) -> str:
    rows = [
        ("clients", summary["clients"]),
        ("duration (s)", summary["seconds"]),
        ("answers", summary["answered"]),
        ("failed", summary["failed"]),
        ("answers/s", summary["answers_per_s"]),
        (
            "ask latency p50 / p90 / p99 / max (s)",
            f"{summary['p50_s']} / {summary['p90_s']} / {summary['p99_s']} / {summary['max_s']}",
        ),
        ("mode switches", summary["switches"]),
        (
            "server RSS start / end / max (MiB)",
            f"{summary['rss_start_mib']} / {summary['rss_end_mib']} / {summary['rss_max_mib']}",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument(
        "--switch-every", type=float, default=0, help="flip PyTorch/TensorRT every N s (needs an engine)"
    )
    parser.add_argument("--engine_path", type=Path)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "test-artifacts" / "load-long.json")
    args = parser.parse_args(argv)
    if args.switch_every and args.engine_path is None:
        parser.error("--switch-every needs --engine_path")

    from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize

    workdir = Path(tempfile.mkdtemp(prefix="medgemma-load-"))
    film = workdir / "film.dcm"
    film.write_bytes(dicom_bytes(quantize(chest_phantom(seed=5), 12), bits_stored=12, window=(2048, 4096)))
    port = _free_port()
    env = {
        **os.environ,
        "LOG_DIR": str(workdir / "logs"),
        "PORT": str(port),
        "MAX_NEW_TOKENS": str(args.max_new_tokens),
    }
    env.pop("KEEP_BOTH_BACKENDS", None)

    def script(name: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPTS / name), *extra], env=env, capture_output=True, text=True, timeout=900)

    start_args = ("--engine_path", str(args.engine_path)) if args.engine_path else ()
    started = script("start_gradio.sh", *start_args)
    if started.returncode != 0:
        print(started.stdout + started.stderr)
        return 1
    pid = int((workdir / "logs" / "gradio_app.pid").read_text())

    def switch(mode: str) -> dict:
        done = script(f"switch_to_{'trt' if mode == 'trt' else 'pytorch'}.sh")
        return {"ok": done.returncode == 0, "output": (done.stdout + done.stderr).strip()[-300:]}

    try:
        result = run_load(
            f"http://127.0.0.1:{port}",
            film,
            args.clients,
            args.seconds,
            pid,
            switch if args.switch_every else None,
            args.switch_every,
        )
    finally:
        script("stop_gradio.sh")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result.to_json(), indent=2))
    print(format_table(result.summary()))
    print(f"written: {args.output}")
    return 0 if not result.failures and all(s["ok"] for s in result.switches) else 1


if __name__ == "__main__":
    raise SystemExit(main())
