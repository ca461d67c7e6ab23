"""The soak's step at switches, in minutes instead of an hour: the real server (scripts/start_gradio.sh, as the soak
starts it), a little load, and PyTorch <-> engine bundle round trips through the operators' scripts
(scripts/switch_to_trt.sh, switch_to_pytorch.sh: the control socket), with the server's RSS after each.

    python -m benchmarks.server_switch_rss BUNDLE_DIR [--round-trips 6] [--phase-s 30] [--output FILE.json]
    python -m benchmarks.server_switch_rss BUNDLE_DIR --env MALLOC_ARENA_MAX=2      # a candidate, one at a time

The one-hour soak (benchmarks/soak.py) found its RSS flat within each 5-minute phase and stepping up at switches to
the bundle, kept by the PyTorch phase after. Here each phase is PHASE_S seconds of load; the figure that matters is
the PyTorch phase's RSS after each round trip (the median of its last half, and the RSS just before the next
switch), against the first: a step that stays there is what the soak's fit called growth. With --probe the server
also samples its memory by layer (devtools/rss_probe.py: glibc's bytes in use and free in heaps, arenas, threads),
and each phase's last sample of each layer is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
PROBE_LAYERS = ("malloc_in_use", "malloc_mmapped", "malloc_free_in_heap", "smaps_Anonymous", "threads", "arenas")


def _rss(pid: int) -> float | None:
    from benchmarks.soak import rss_mib

    return rss_mib(pid)


def _switch(env: dict, target: str) -> dict:
    began = time.monotonic()
    done = subprocess.run(
        [str(SCRIPTS / f"switch_to_{target}.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    said = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode != 0:
        raise RuntimeError(f"switch to {target} failed: {said[-1] if said else done.returncode}")
    return {"to": target, "seconds": round(time.monotonic() - began, 1), "said": said[-1][:200] if said else ""}


def _last_probe_row(probe_dir: Path, pid: int) -> dict:
    path = probe_dir / "samples.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    mine = [r for r in rows if r.get("pid") == pid]
    if not mine:
        return {}
    last = mine[-1]
    return {k: (round(last[k] / 2**20, 1) if k.startswith(("malloc", "smaps")) else last[k]) for k in PROBE_LAYERS}


def _snapshot(probe_dir: Path, timeout_s: float = 120.0) -> str | None:
    """Ask the server's probe for a gc snapshot now (who holds each --chase object); the file it wrote, if any (the
    first snapshot is the baseline and writes none)."""
    from devtools.rss_probe import SNAPSHOT_REQUEST

    before = set(probe_dir.glob("diff-*.txt"))
    request = probe_dir / SNAPSHOT_REQUEST
    request.touch()
    deadline = time.monotonic() + timeout_s
    while request.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    written = sorted(set(probe_dir.glob("diff-*.txt")) - before)
    return str(written[-1]) if written else None


class Run:
    """Owns the server (through benchmarks.supervisor), the load threads and the RSS sampler thread."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.samples: list[tuple[float, float]] = []  # (s since start, MiB)
        self.stop = threading.Event()

    def run(self) -> dict:
        from benchmarks.soak import films
        from benchmarks.soak_clients import Recorder, api_user, main_page_user
        from benchmarks.supervisor import Supervisor
        from devtools.loadtest import _free_port

        args = self.args
        scratch = REPO_ROOT / "test-artifacts"
        scratch.mkdir(exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="switch-rss-", dir=scratch))
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "LOG_DIR": str(workdir / "logs"),
            "PORT": str(port),
            "MAX_NEW_TOKENS": str(args.max_new_tokens),
            "UPLOAD_CACHE_DIR": str(workdir / "upload-cache"),
            "ENGINE_PATH": str(args.bundle.resolve()),
        }
        env.pop("KEEP_BOTH_BACKENDS", None)
        probe_dir = workdir / "probe"
        if args.probe:
            site = workdir / "site"
            site.mkdir()
            (site / "sitecustomize.py").write_text("from devtools.rss_probe import start_from_env\nstart_from_env()\n")
            path = [str(site), str(REPO_ROOT), str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")]
            env |= {"PYTHONPATH": os.pathsep.join(p for p in path if p), "RSS_PROBE_DIR": str(probe_dir)}
            env |= {"RSS_PROBE_EVERY_S": "2", "RSS_PROBE_WARMUP_S": "1e9", "RSS_PROBE_CHASE": args.chase}

        for pair in args.env:
            key, _, value = pair.partition("=")
            env[key] = value
        users = args.main_clients + args.api_clients
        paths, urls = films(workdir, max(users, 1))
        supervisor = Supervisor(env, url, workdir / "supervisor.log")
        supervisor.start()
        pid = supervisor.pid
        assert pid is not None
        started = time.monotonic()
        deadline = started + 24 * 3600
        recorder = Recorder(started)

        def pause(seconds: float) -> None:
            time.sleep(seconds)  # the clients are daemons: after the run they retry slowly until this process ends

        threads = [threading.Thread(target=self._sample, args=(pid, started), name="switch-rss-sampler", daemon=True)]
        for index in range(args.main_clients):
            threads.append(
                threading.Thread(
                    target=main_page_user,
                    args=(index, url, paths[index], deadline, recorder, pause),
                    name=f"switch-rss-main-{index}",
                    daemon=True,
                )
            )
        for index in range(args.main_clients, users):
            threads.append(
                threading.Thread(
                    target=api_user,
                    args=(index, url, urls[index], deadline, recorder, pause, args.max_new_tokens),
                    name=f"switch-rss-api-{index}",
                    daemon=True,
                )
            )
        for thread in threads:
            thread.start()
        phases: list[dict] = []
        answers = []
        try:
            mode = "pytorch"
            for index in range(2 * args.round_trips + 1):
                phase_started = time.monotonic() - started
                self.stop.wait(args.phase_s)
                if supervisor.pid != pid:
                    raise RuntimeError(f"the server died; see {workdir / 'supervisor.log'}")
                window = [mib for s, mib in self.samples if s >= phase_started + args.phase_s / 2]
                phase = {
                    "index": index,
                    "mode": mode,
                    "median_mib": round(statistics.median(window), 1) if window else None,
                    "end_mib": _rss(pid),
                }
                if args.probe:
                    phase["layers"] = _last_probe_row(probe_dir, pid)
                if args.chase:
                    phase["snapshot"] = _snapshot(probe_dir)
                if index < 2 * args.round_trips:
                    mode = "trt" if mode == "pytorch" else "pytorch"
                    phase["switch"] = _switch(env, mode)
                phases.append(phase)
                print(json.dumps(phase), flush=True)
            answers = recorder.snapshot()  # before the stop: answers refused by a stopping server are not the run's
        finally:
            self.stop.set()  # the clients are daemons: they end with this process, their server stopped
            supervisor.stop()
        return {
            "command": "python -m benchmarks.server_switch_rss " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
            "env": args.env,
            "answers": {
                "ok": sum(a.outcome == "ok" for a in answers),
                "other": sum(a.outcome != "ok" for a in answers),
                "messages": sorted({a.message[:160] for a in answers if a.outcome != "ok"})[:5],
            },
            "phases": phases,
            "summary": summary(phases),
            "workdir": str(workdir),
        }

    def _sample(self, pid: int, started: float) -> None:
        while not self.stop.wait(1.0):
            mib = _rss(pid)
            if mib is not None:
                self.samples.append((time.monotonic() - started, mib))


def summary(phases: list[dict]) -> dict:
    """Each backend's phase levels and their steps over its first phase: what a round trip keeps."""
    out: dict = {}
    for mode in ("pytorch", "trt"):
        levels = [p["end_mib"] for p in phases if p["mode"] == mode and p["end_mib"] is not None]
        medians = [p["median_mib"] for p in phases if p["mode"] == mode and p["median_mib"] is not None]
        out[mode] = {
            "end_mib": levels,
            "median_mib": medians,
            "kept_over_first_mib": round(levels[-1] - levels[0], 1) if len(levels) > 1 else None,
            "median_kept_over_first_mib": round(medians[-1] - medians[0], 1) if len(medians) > 1 else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--round-trips", type=int, default=6)
    parser.add_argument("--phase-s", type=float, default=30)
    parser.add_argument("--main-clients", type=int, default=1)
    parser.add_argument("--api-clients", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--probe", action="store_true", help="sample the server's memory by layer (rss_probe)")
    parser.add_argument(
        "--chase", default="", help="with --probe: types (module.qualname, commas) whose holders to print"
    )
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server's environment")
    parser.add_argument("--output", type=Path, help="write the run as JSON here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run stops its server too (finally)
    result = Run(args).run()
    print(json.dumps(result["summary"], indent=1))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
