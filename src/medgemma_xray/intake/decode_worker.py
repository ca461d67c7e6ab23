"""A film decode worker process (intake.decode_pool starts it): read a DecodeTask, decode it, answer, repeat,
until the server closes the connection. Its log lines go back with each answer, so they reach the server's log
(and never this process's stderr)."""

from __future__ import annotations

import ctypes
import gc
import logging
import pickle
import signal
import sys
from dataclasses import replace
from multiprocessing.connection import Connection


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[int, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.name, record.getMessage()))


def serve(connection: Connection) -> None:
    from medgemma_xray.intake.decoding import decode_film
    from medgemma_xray.xray_io.errors import ImageInputError

    collect = _Collect()
    root = logging.getLogger()
    root.handlers[:] = [collect]
    root.setLevel(logging.INFO)
    trim = _malloc_trim()
    connection.send_bytes(b"ready")
    while True:
        try:
            task = replace(pickle.loads(connection.recv_bytes()), data=connection.recv_bytes())
        except EOFError:
            return
        collect.records = []
        answer: tuple[str, object, list[tuple[int, str, str]]]
        try:
            answer = ("ok", decode_film(task), collect.records)
        except ImageInputError as exc:
            exc.__cause__ = exc.__context__ = None  # the message is the answer; the cause stays here
            answer = ("error", exc, collect.records)
        except Exception as exc:  # a bug, named by its class only (its text may quote the file)
            answer = ("failed", type(exc).__name__, collect.records)
        del task
        connection.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
        del answer
        gc.collect()
        trim()  # a decoder's peak goes back to the system before the next film


def _malloc_trim():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return lambda: libc.malloc_trim(0)
    except OSError:  # not glibc
        return lambda: None


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server ends us
    serve(Connection(int(sys.argv[1])))
