"""The soak: an hour of real clients at every door while faults are injected on a schedule, with the server's RSS
sampled throughout. Not part of the fast suite (tests/benchmarks/test_soak.py runs it for a few minutes).

    python -m benchmarks.soak --minutes 60 --engine_path DIR

Load: users on the main page (gradio_client), on /v1/chat/completions (the openai client, the film as a data: URL)
and on /teaching (gradio_client), each answer recorded as ok, failed (with the message shown), refused (the
connection was refused while the server restarted: nothing reached it) or lost (no answer and no message).

Faults, at fixed fractions of the run (each waits for a ready server), so a short run (--minutes 4) meets each of
them once:
- kill -9 of the server, twice, in the first half; benchmarks/supervisor.py restarts it as systemd's
  Restart=on-failure would (scripts/start_gradio.sh --foreground);
- a full log disk, twice: LOG_DIR is a small tmpfs of its own, filled for a while, then freed;
- 300 slow clients (slowloris: headers or a POST body a byte every 5 s), twice, for a while;
- a switch between PyTorch and the engine bundle every --switch-every-s (scripts/switch_to_trt.sh and
  switch_to_pytorch.sh, through the control socket).

Figures: answers by door and outcome; answers lost outside a kill window (target 0); the messages of failures;
RSS growth over the second half, in MiB/min, by a least-squares fit with one level per backend (so a switch's
swing between the PyTorch and the ONNX Runtime footprint is not read as growth, while a step that stays after a
round trip is), and the plain fit beside it. Target: <= 0.5 MiB/min. Written to OUTPUT/NAME.json (rewritten every
minute, marked "complete": false until the end), NAME.png and NAME.md.

Needs root for the log-disk fault (it mounts a tmpfs); without root that fault is skipped and the JSON says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.soak_clients import Recorder, api_user, film_data_url, main_page_user, teaching_user
from benchmarks.soak_faults import SlowClients, fill_disk, free_disk, mount_log_disk, unmount_log_disk
from benchmarks.soak_report import account, markdown, plot
from benchmarks.supervisor import Supervisor

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
TARGET_GROWTH_MIB_PER_MIN = 0.5
DISK_WARNING = "log disk"  # the words the server's warning about lost log records carries (serving/log_disk.py)

# (fraction of the run, fault, fraction it lasts). Kills are in the first half, so the second half, over which
# RSS growth is judged, is one process; the other faults come once in each half.
SCHEDULE = (
    (0.12, "kill", 0.0),
    (0.22, "log_disk_full", 0.07),
    (0.34, "kill", 0.0),
    (0.40, "slow_clients", 0.06),
    (0.62, "log_disk_full", 0.05),
    (0.78, "slow_clients", 0.05),
)
# A short run (under SHORT_MIN minutes) meets each fault once: a restart alone takes a minute on a loaded host.
SHORT_MIN = 10
# The kill comes last, so the faults before it meet a server that is up; the soak then waits for the restart.
SCHEDULE_SHORT = (
    (0.08, "log_disk_full", 0.2),
    (0.35, "slow_clients", 0.2),
    (0.65, "kill", 0.0),
)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


LOG_SIGNS = {  # what must not be in the server's log after the faults, and what must
    "internal_errors": "internal error",
    "tracebacks": "Traceback (most recent call last)",
    "logging_errors": "--- Logging error ---",
    "lost_record_warnings": "log disk was full",
}


def scan_logs(log_dir: Path, console: Path) -> dict:
    """Counts of LOG_SIGNS in the app log (all its rotated files) and in the server's console output (which the
    supervisor captures, as journald would)."""
    files = sorted(log_dir.glob("gradio_app.log*")) + [console]
    text = ""
    for path in files:
        if path.exists():
            text += path.read_text(errors="replace")
    return {name: text.count(sign) for name, sign in LOG_SIGNS.items()} | {"bytes": len(text)}


def films(workdir: Path, count: int) -> tuple[list[Path], list[str]]:
    """Each user its own film (no cache serves one user's for another's): DICOMs for the pages, PNG data: URLs for
    the API."""
    from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize

    paths, urls = [], []
    for index in range(count):
        phantom = chest_phantom(seed=100 + index)
        path = workdir / f"film-{index}.dcm"
        path.write_bytes(dicom_bytes(quantize(phantom, 12), bits_stored=12, window=(2048, 4096)))
        paths.append(path)
        urls.append(film_data_url(png_bytes(quantize(phantom, 8))))
    return paths, urls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--main-clients", type=int, default=4)
    parser.add_argument("--api-clients", type=int, default=2)
    parser.add_argument("--teaching-clients", type=int, default=1)
    parser.add_argument("--switch-every-s", type=float, default=300)
    parser.add_argument("--sample-every-s", type=float, default=5)
    parser.add_argument("--engine_path", type=Path, help="engine bundle to switch to (default: build the demo one)")
    parser.add_argument("--no-switch", action="store_true", help="PyTorch only (no bundle built)")
    parser.add_argument(
        "--no-faults", action="store_true", help="load (and switches) only: no kill, full disk or slow clients"
    )
    parser.add_argument("--slow-clients", type=int, default=300)
    parser.add_argument("--log-disk-mib", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--name", help="file name stem (default: DATE-soak-MINUTESmin)")
    parser.add_argument("--report-only", type=Path, help="redraw NAME.md and NAME.png from this JSON")
    args = parser.parse_args(argv)
    if args.report_only is not None:
        body = json.loads(args.report_only.read_text())
        stem = args.report_only.with_suffix("")
        plot(body, stem.with_suffix(".png"))
        stem.with_suffix(".md").write_text(markdown(body))
        return 0
    command = "python -m benchmarks.soak " + shlex.join(argv if argv is not None else sys.argv[1:])
    return Soak(args, command).run()


class Soak:
    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args = args
        self.output = args.output_dir.resolve()
        self.name = args.name or time.strftime("%Y-%m-%d", time.gmtime()) + f"-soak-{args.minutes:g}min"
        self.body: dict = {
            "command": command,
            "started_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.1f}",
            "planned_min": args.minutes,
            "complete": False,
            "clients": {"main": args.main_clients, "api": args.api_clients, "teaching": args.teaching_clients},
            "target_growth_mib_per_min": TARGET_GROWTH_MIB_PER_MIN,
            "rss": [],  # [s, MiB of the server process, pid]
            "kills": [],  # {at_s, pid, ready_s}
            "restarts": [],
            "switches": [],  # {at_s, to, ok, seconds, said}
            "log_disk": [],  # {from_s, to_s, free_bytes, warning_logged}
            "slow_clients": [],  # {from_s, to_s, count, opened, closed_by_server, connect_failed}
            "skipped": [],
            "answers_fields": ["door", "client", "t0_s", "t1_s", "outcome", "retryable", "message"],
            "answers": [],
        }
        self.lock = threading.Lock()

    # --- the run ----------------------------------------------------------------------------------------------
    def run(self) -> int:
        from devtools.loadtest import _free_port

        args = self.args
        self.output.mkdir(parents=True, exist_ok=True)
        scratch = REPO_ROOT / "test-artifacts"
        scratch.mkdir(exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="soak-", dir=scratch))
        log_dir = workdir / "logs"
        mounted = False
        if args.log_disk_mib > 0 and os.geteuid() == 0 and not args.no_faults:
            mount_log_disk(log_dir, args.log_disk_mib)
            mounted = True
        elif args.log_disk_mib > 0 and not args.no_faults:
            self.body["skipped"].append("log_disk_full: mounting a tmpfs needs root")
        engine = None
        if not args.no_switch:
            from benchmarks.soak_bundle import build_bundle

            engine = args.engine_path or build_bundle(workdir)
        users = args.main_clients + args.api_clients + args.teaching_clients
        paths, urls = films(workdir, users)
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "LOG_DIR": str(log_dir),
            "PORT": str(port),
            "MAX_NEW_TOKENS": str(args.max_new_tokens),
            "UPLOAD_CACHE_DIR": str(workdir / "upload-cache"),  # uploads on the data disk, logs on the log disk
        }
        if engine is not None:
            self.env["ENGINE_PATH"] = str(Path(engine).resolve())
        self.env.pop("KEEP_BOTH_BACKENDS", None)
        self.body["workdir"] = str(workdir)
        self.supervisor = Supervisor(self.env, self.url, workdir / "supervisor.log")
        try:
            self.supervisor.start()
            self._load_and_faults(paths, urls, engine is not None)
        finally:
            self.supervisor.stop()
            if mounted:
                free_disk(log_dir)
            self.body["server_log"] = scan_logs(log_dir, workdir / "supervisor.log")
            if mounted:
                self._copy_logs(log_dir, workdir / "logs-copy")
                unmount_log_disk(log_dir)
        self._finish()
        summary = self.body["summary"]
        print(markdown(self.body))
        ok = summary["lost_outside_kill_windows"] == 0 and summary["failed_not_retryable"] == 0
        growth = summary["rss"]["growth_mib_per_min"]
        return 0 if ok and growth is not None and growth <= TARGET_GROWTH_MIB_PER_MIN else 1

    def _load_and_faults(self, paths: list[Path], urls: list[str], switching: bool) -> None:
        args = self.args
        self.started = time.monotonic()
        self.recorder = Recorder(self.started)
        deadline = self.started + args.minutes * 60

        def pause(seconds: float) -> None:
            time.sleep(max(0.0, min(seconds, deadline - time.monotonic())))

        threads, index = [], 0
        for kind, count in (
            ("main", args.main_clients),
            ("api", args.api_clients),
            ("teaching", args.teaching_clients),
        ):
            for _ in range(count):
                if kind == "main":
                    target, extra = main_page_user, (paths[index], deadline, self.recorder, pause)
                elif kind == "api":
                    target, extra = api_user, (urls[index], deadline, self.recorder, pause, args.max_new_tokens)
                else:
                    target, extra = teaching_user, (paths[index], deadline, self.recorder, pause)
                threads.append(
                    threading.Thread(target=target, args=(index, self.url, *extra), name=f"soak-{kind}-{index}")
                )
                index += 1
        for thread in threads:
            thread.start()
        schedule = () if args.no_faults else SCHEDULE if args.minutes >= SHORT_MIN else SCHEDULE_SHORT
        planned = sorted((frac * args.minutes * 60, fault, dur * args.minutes * 60) for frac, fault, dur in schedule)
        ends: list[tuple[float, str, object]] = []
        mode, next_switch = "pytorch", args.switch_every_s
        next_sample, next_write = 0.0, 60.0
        while any(thread.is_alive() for thread in threads):
            now = time.monotonic() - self.started
            self.supervisor.note_ready()
            self._note_ready_after_kill()
            if now >= next_sample:
                pid = self.supervisor.pid
                value = rss_mib(pid) if pid else None
                if value is not None:
                    self.body["rss"].append([round(now, 1), value, pid])
                next_sample += args.sample_every_s
            # A fault waits for a ready server: each one is about a running server, not a restarting one.
            while planned and now >= planned[0][0] and now < args.minutes * 60 and self.supervisor.note_ready():
                _, fault, lasts = planned.pop(0)
                ended = self._begin(fault, now, lasts)
                if fault == "kill":
                    mode = "pytorch"  # a restarted server starts in PyTorch
                if ended is not None:
                    ends.append(ended)
            for end in [e for e in ends if now >= e[0]]:
                ends.remove(end)
                self._end(end[1], end[2])
            if switching and now >= next_switch and now < args.minutes * 60 - 20:
                if self.supervisor.note_ready():  # a switch is for a running server; a restart starts in PyTorch
                    mode = self._switch(now, mode)
                next_switch += args.switch_every_s
            if now >= next_write:
                self._write()
                next_write += 60
            time.sleep(0.5)
        for end in ends:
            self._end(end[1], end[2])
        for thread in threads:
            thread.join()
        if self.body["kills"]:  # the last restart's time to ready belongs to the figures, even past the deadline
            self.supervisor.wait_ready(600)
            self._note_ready_after_kill()
        for _, fault, _ in planned:
            self.body["skipped"].append(f"{fault}: the server was not ready before the end of the run")

    def _begin(self, fault: str, now: float, lasts: float):
        if fault == "kill":
            if any(d["to_s"] is None for d in self.body["log_disk"]):
                self.body["skipped"].append(f"kill at {now:.0f} s: the log disk was full (no restart could start)")
                return None
            pid = self.supervisor.kill9()
            self.body["kills"].append({"at_s": round(now, 2), "pid": pid, "ready_s": None})
            return None
        if fault == "log_disk_full":
            if "log_disk_full: mounting a tmpfs needs root" in self.body["skipped"]:
                return None
            free = fill_disk(self.log_dir)
            entry = {"from_s": round(now, 1), "to_s": None, "free_bytes": free, "warning_logged": None}
            self.body["log_disk"].append(entry)
            return (now + lasts, fault, entry)
        if fault == "slow_clients":
            host, port = self.url.removeprefix("http://").split(":")
            slow = SlowClients(host, int(port), self.args.slow_clients)
            slow.start()
            entry = {"from_s": round(now, 1), "to_s": None, "count": self.args.slow_clients}
            self.body["slow_clients"].append(entry)
            return (now + lasts, fault, (entry, slow))
        raise ValueError(fault)

    def _end(self, fault: str, state) -> None:
        now = round(time.monotonic() - self.started, 1)
        if fault == "log_disk_full":
            free_disk(self.log_dir)
            state["to_s"] = now
            state["warning_logged"] = self._disk_warning_logged()
        elif fault == "slow_clients":
            entry, slow = state
            slow.stop()
            entry["to_s"] = now
            entry.update(slow.figures())

    def _disk_warning_logged(self) -> bool:
        """Did the server say, once the disk had room, that it lost log records while it was full? Waits a little:
        the warning is written with the next record."""
        log = self.log_dir / "gradio_app.log"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if DISK_WARNING in log.read_text(errors="replace"):
                    return True
            except OSError:
                pass
            time.sleep(1)
        return False

    def _note_ready_after_kill(self) -> None:
        for kill in self.body["kills"]:
            if kill["ready_s"] is None:
                after = [at for pid, at in self.supervisor.ready_at if pid != kill["pid"] and at >= self._mono(kill)]
                if after:
                    kill["ready_s"] = round(after[0] - self.started, 2)

    def _mono(self, kill: dict) -> float:
        return self.started + kill["at_s"]

    def _switch(self, now: float, mode: str) -> str:
        target = "trt" if mode == "pytorch" else "pytorch"
        began = time.monotonic()
        done = subprocess.run(
            [str(SCRIPTS / f"switch_to_{target}.sh")], env=self.env, capture_output=True, text=True, timeout=900
        )
        said = (done.stdout + done.stderr).strip().splitlines()
        self.body["switches"].append(
            {
                "at_s": round(now, 1),
                "to": target,
                "ok": done.returncode == 0,
                "seconds": round(time.monotonic() - began, 1),
                "said": said[-1][:300] if said else "",
            }
        )
        return target if done.returncode == 0 else mode

    def _copy_logs(self, log_dir: Path, to: Path) -> None:
        to.mkdir(exist_ok=True)
        for name in ("gradio_app.log", "gradio_app.console.log"):
            if (log_dir / name).exists():
                (to / name).write_bytes((log_dir / name).read_bytes())

    # --- output -------------------------------------------------------------------------------------------------
    def _write(self) -> None:
        self.body["elapsed_min"] = round((time.monotonic() - self.started) / 60, 2)
        self.body["restarts"] = [
            {"pid": e.pid, "at_s": round(e.at - self.started, 2), "status": e.status} for e in self.supervisor.exits
        ]
        self.body["answers"] = [a.row() for a in self.recorder.snapshot()]
        self.body["summary"] = account(self.body)
        path = self.output / f"{self.name}.json"
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(self.body, indent=1))
        temporary.replace(path)

    def _finish(self) -> None:
        self.body["complete"] = (time.monotonic() - self.started) >= self.args.minutes * 60
        self._write()
        plot(self.body, self.output / f"{self.name}.png")
        (self.output / f"{self.name}.md").write_text(markdown(self.body))


if __name__ == "__main__":
    raise SystemExit(main())
