"""A systemd-like supervisor for the soak: it runs `scripts/start_gradio.sh --foreground` (as the unit's ExecStart
does) and restarts the server when it dies, as `Restart=on-failure` with `RestartPreventExitStatus=2 98` would
(docs/operators/systemd.md). The soak needs this because a kill -9 is one of its faults: without a restart, every
later answer would fail and say nothing about the server.

One thread owns the child: it waits for it, records each exit, and starts the next one after RESTART_SEC. `stop()`
sends SIGTERM (systemd's stop) and waits out the drain.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
START_SCRIPT = REPO_ROOT / "scripts" / "start_gradio.sh"
RESTART_SEC = 1.0  # systemd's RestartSec: a short pause, so a crash loop does not spin
NO_RESTART = (0, 2, 98)  # clean stop, and RestartPreventExitStatus (bad configuration, port taken)


@dataclass
class Exit:
    pid: int
    at: float  # time.monotonic()
    status: int  # negative: killed by that signal


@dataclass
class Supervisor:
    env: dict
    url: str
    log: Path  # the supervisor's own capture of the child's stdout and stderr (journald's place)
    starts: list[tuple[int, float]] = field(default_factory=list)  # (pid, monotonic) per start
    ready_at: list[tuple[int, float]] = field(default_factory=list)  # (pid, monotonic) when /readyz said ready
    exits: list[Exit] = field(default_factory=list)
    _child: subprocess.Popen | None = None
    _stopping: bool = False
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, timeout_s: float = 900.0) -> None:
        """Start the first server and return once it is ready (or raise)."""
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="soak-supervisor", daemon=True)
        self._thread.start()
        if not self.wait_ready(timeout_s):
            raise RuntimeError(f"the server was not ready within {timeout_s:.0f} s; see {self.log}")

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._child.pid if self._child is not None and self._child.poll() is None else None

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until the current child answers /readyz with ready (a restarted one included)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stopping:
            if self.note_ready():
                return True
            time.sleep(0.25)
        return False

    def note_ready(self) -> bool:
        """One look: is the current child ready? The first time it is, its ready time is recorded. The soak's main
        loop calls this every tick, so a restart's ready time is known to within a tick."""
        pid = self.pid
        if pid is None:
            return False
        if self.ready_at and self.ready_at[-1][0] == pid:
            return True
        if _ready(self.url):
            self.ready_at.append((pid, time.monotonic()))
            return True
        return False

    def kill9(self) -> int | None:
        """The fault: SIGKILL the running server. Returns its PID, or None if none was running."""
        pid = self.pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, timeout_s: float = 180.0) -> None:
        self._stopping = True
        with self._lock:
            child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _spawn(self) -> None:
        with self.log.open("ab") as sink:
            child = subprocess.Popen(
                [str(START_SCRIPT), "--foreground"],
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
            )
        with self._lock:
            self._child = child
            self.starts.append((child.pid, time.monotonic()))

    def _watch(self) -> None:
        while True:
            with self._lock:
                child = self._child
            status = child.wait()
            with self._lock:
                self.exits.append(Exit(child.pid, time.monotonic(), status))
            if self._stopping or status in NO_RESTART:
                return
            time.sleep(RESTART_SEC)
            if self._stopping:
                return
            self._spawn()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2.0) as reply:
            return json.loads(reply.read(4096)).get("ready") is True
    except (OSError, ValueError, urllib.error.HTTPError):
        return False
