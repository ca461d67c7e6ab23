"""Film decodes in worker processes, each under a deadline that a hard kill enforces.

Counting what a decoder will do from the file's markers closes the bombs that are known; a deadline closes the
rest, for every format: a JPEG 2000 of pathological tiles, a PNG of many tiny IDAT chunks, the next decoder bug.
A thread cannot be stopped inside a C decoder, and a process can. So each decode runs in a worker process (started
as `python -m medgemma_xray.intake.decode_worker`, never forked from a server with threads), and a worker that has
not answered within the deadline is killed with SIGKILL: the caller gets FilmDecodeTimeout at once, and the next
decode gets a fresh worker. A worker that dies (a decoder's crash, the kernel's OOM killer) is a refusal too, never
an internal error. The full-resolution film lives and dies in the worker; the server receives the model's image,
a small preview and, when asked, the film's values.

The pool holds at most `size` workers; its callers bound how many decodes run at once (FilmIntake's decode slots),
and a decode finds an idle worker or starts one. The deadline counts from the moment the worker has the bytes, not
from its start-up. A worker is replaced after MAX_TASKS decodes, so a long-lived server does not keep a decoder's
heap forever. close() (also at interpreter exit) ends them all; a worker whose server died reads end-of-file and
exits.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path

from medgemma_xray.intake.decoding import DecodedFilm, DecodeTask
from medgemma_xray.xray_io.errors import CorruptImageError, ImageInputError

logger = logging.getLogger(__name__)

MAX_TASKS = 200  # decodes one worker runs before it is replaced
START_TIMEOUT_S = 120.0  # a worker's start-up (imports on a loaded machine), not part of any decode's deadline


class FilmDecodeTimeout(ImageInputError):
    """The decode ran past the deadline and its worker was killed."""


class DecodeWorkerFailed(RuntimeError):
    """A worker could not be started: the server's installation, not the film."""


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    connection: Connection
    tasks: int = 0

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        self.connection.close()


class DecodePool:
    """Worker processes for film decodes. Thread-safe; one per FilmIntake."""

    def __init__(self, size: int, deadline_s: float) -> None:
        if size < 1 or deadline_s <= 0:
            raise ValueError(f"a decode pool needs size >= 1 and a positive deadline, got {size} and {deadline_s}")
        self.size = size
        self.deadline_s = deadline_s
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self.killed = 0  # workers killed at the deadline, ever
        _POOLS.add(self)

    def decode(self, task: DecodeTask) -> DecodedFilm:
        """The decoded film, or the loader's ImageInputError; FilmDecodeTimeout past the deadline; a
        CorruptImageError when the worker dies while decoding."""
        worker = self._take()
        keep = False
        try:
            # The limits first, then the bytes as they are (no pickled copy of a film of up to MAX_FILE_SIZE_MB).
            worker.connection.send_bytes(pickle.dumps(replace(task, data=b""), protocol=pickle.HIGHEST_PROTOCOL))
            worker.connection.send_bytes(task.data)
            if not worker.connection.poll(self.deadline_s):
                self.killed += 1
                logger.warning("film decode ran past its %.0f s deadline; its worker was killed", self.deadline_s)
                raise FilmDecodeTimeout(
                    f"Decoding this film took longer than {self.deadline_s:g} s, so it was stopped. Its file is far "
                    "costlier to decode than a chest film (many passes over the image, or unusual compression). "
                    "Save the film again as PNG, or as a baseline JPEG, and upload that."
                )
            outcome, payload, records = pickle.loads(worker.connection.recv_bytes())
            keep = True
        except (EOFError, OSError) as exc:  # the worker died: a decoder's crash, or killed for memory
            logger.warning("a film decode worker died while decoding (%s)", type(exc).__name__)
            raise CorruptImageError(
                "The decoder stopped while reading this file, so it was refused. The file is damaged or built to "
                "exhaust the decoder; export the film again as DICOM, PNG or JPEG."
            ) from None
        finally:
            self._give_back(worker, keep)
        for level, name, message in records:  # the worker's log lines (never a file name or tag), in this log
            logging.getLogger(name).log(level, "%s", message)
        if outcome == "error":
            raise payload
        if outcome == "failed":  # a bug outside the loader's own errors: the server's, named by its class
            raise RuntimeError(f"the film decode worker failed: {payload}")
        return payload

    def close(self) -> None:
        """Kill every idle worker; busy ones are killed when their decode ends. Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    @property
    def idle_pids(self) -> list[int]:
        with self._lock:
            return [worker.process.pid for worker in self._idle]

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise DecodeWorkerFailed("the film decode pool is closed")
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    return worker
                worker.connection.close()  # died while idle (killed by the OOM killer, say): not this film's fault
        return _start_worker()

    def _give_back(self, worker: _Worker, healthy: bool) -> None:
        worker.tasks += 1
        with self._lock:
            if healthy and not self._closed and worker.tasks < MAX_TASKS and len(self._idle) < self.size:
                self._idle.append(worker)
                return
        worker.kill()


def _start_worker() -> _Worker:
    ours, theirs = socket.socketpair()
    package_root = str(Path(__file__).resolve().parents[2])  # src/, so the worker imports this very tree
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "medgemma_xray.intake.decode_worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
    finally:
        theirs.close()
    connection = Connection(ours.detach())
    worker = _Worker(process, connection)
    try:
        ready = connection.poll(START_TIMEOUT_S) and connection.recv_bytes() == b"ready"
    except (EOFError, OSError):
        ready = False
    if not ready:
        worker.kill()
        raise DecodeWorkerFailed(
            f"a film decode worker did not start within {START_TIMEOUT_S:g} s (exit status {process.returncode}); "
            "check that the package is installed for this Python"
        )
    return worker


_POOLS: weakref.WeakSet[DecodePool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    for pool in list(_POOLS):
        pool.close()
