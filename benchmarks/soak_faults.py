"""The soak's faults besides kill -9 (benchmarks/supervisor.py) and the switch (scripts/switch_to_*.sh):

- a full log disk: LOG_DIR is a small tmpfs of its own; the fault fills it with one file and frees it afterwards;
- slow clients: connections from another loopback address (127.0.0.2, so the per-address budget of the soak's own
  users on 127.0.0.1 is not theirs) that send their request a byte every few seconds, half in the headers and half
  in a POST body, and reconnect when the server closes them.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

FILLER = "soak-filler"


def mount_log_disk(folder: Path, size_mib: int) -> None:
    """A tmpfs of size_mib at folder (0700, this user's), so the log disk can be filled without touching others."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(folder)], check=True)


def unmount_log_disk(folder: Path) -> None:
    subprocess.run(["umount", "--lazy", str(folder)], check=False)


def fill_disk(folder: Path) -> int:
    """Write one file until the disk is full; returns the bytes free afterwards (0 on a tmpfs)."""
    descriptor = os.open(folder / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 4096, 1):  # big blocks, then the last crumbs
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while os.write(descriptor, block):
                    pass
    finally:
        os.close(descriptor)
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def free_disk(folder: Path) -> None:
    (folder / FILLER).unlink(missing_ok=True)


@dataclass
class SlowClients:
    """`count` slow connections held open until stop(); one thread owns all their sockets (a selector)."""

    host: str
    port: int
    count: int
    source: str = "127.0.0.2"
    byte_every_s: float = 5.0
    opened: int = 0  # connections made, reconnections included
    closed_by_server: int = 0
    refused: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-slow-clients", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def figures(self) -> dict:
        return {"opened": self.opened, "closed_by_server": self.closed_by_server, "connect_failed": self.refused}

    def _open(self, index: int) -> socket.socket | None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.source, 0))
            sock.settimeout(5.0)
            sock.connect((self.host, self.port))
            sock.setblocking(False)
            if index % 2:
                # a POST whose body comes a byte at a time
                sock.send(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100000\r\n\r\n{"
                )
            else:
                sock.send(b"GET /healthz HTTP/1.1\r\nHost: soak\r\n")  # headers that never end
        except OSError:
            self.refused += 1
            sock.close()
            return None
        self.opened += 1
        return sock

    def _run(self) -> None:
        chooser = selectors.DefaultSelector()
        live: dict[int, socket.socket] = {}
        next_byte = time.monotonic()
        try:
            while not self._stop.is_set():
                for index in range(self.count):
                    if index not in live and not self._stop.is_set():
                        sock = self._open(index)
                        if sock is not None:
                            live[index] = sock
                            chooser.register(sock, selectors.EVENT_READ, index)
                for key, _ in chooser.select(timeout=0.5):  # the server answered or closed: start that one over
                    index = key.data
                    sock = live.pop(index)
                    chooser.unregister(sock)
                    with contextlib.suppress(OSError):
                        sock.recv(65536)
                    sock.close()
                    self.closed_by_server += 1
                if time.monotonic() >= next_byte:
                    next_byte += self.byte_every_s
                    for index, sock in list(live.items()):
                        try:
                            sock.send(b" " if index % 2 else b"X-Slow: 1\r\n")
                        except OSError:
                            chooser.unregister(sock)
                            sock.close()
                            live.pop(index)
                            self.closed_by_server += 1
        finally:
            for sock in live.values():
                sock.close()
            chooser.close()
