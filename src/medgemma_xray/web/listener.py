"""Take the UI port before the model loads, and hand the bound socket to uvicorn.

Binding first means a taken port fails in a fraction of a second instead of after minutes of loading, and no
other program can take the port while the model loads (connections are refused until uvicorn listens).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from medgemma_xray.web.connection_budget import ConnectionBook


class PortInUseError(RuntimeError):
    """Another listener holds HOST:PORT."""


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (not yet listening; uvicorn calls listen). Raises PortInUseError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn's Config.bind_socket chooses
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart may reuse TIME_WAIT ports
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        holders = ", ".join(f"PID {pid} ({name})" for pid, name in listening_processes(port)) or "another program"
        raise PortInUseError(
            f"{host}:{port} is already in use by {holders}. Stop that program, or choose another port "
            "(--port N, or PORT=N in the environment file)."
        ) from None
    return sock


def listening_processes(port: int) -> list[tuple[int, str]]:
    """The processes this user may see that listen on a TCP port (best effort: others' are hidden)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            columns = row.split()
            if columns[3] == "0A" and int(columns[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{columns[9]}]")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            targets = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
            if targets & inodes:
                found.append((int(entry.name), (entry / "comm").read_text().strip()))
        except OSError:
            continue
    return sorted(found)


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit; returns (old soft, new soft).

    systemd and most shells start services at a soft limit of 1,024 (for select()'s sake) and expect a program
    that needs more to raise it itself. Every connection is a file: at 1,024 a crowd of idle connections makes
    accept() fail for everyone, /healthz included. uvicorn uses epoll, which has no such ceiling.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, target
    return soft, soft


def guarded_protocol(header_timeout_s: float, book: ConnectionBook | None = None, keep_alive_s: float = 0.0):
    """uvicorn's h11 protocol with two guards: the request-head timeout, and the connection budget.

    Head timeout: a connection that has not sent a whole request head within header_timeout_s of connecting, or
    within the longer of header_timeout_s and keep_alive_s of its last response, is closed (an idle kept-alive
    connection lives as long as KEEP_ALIVE_TIMEOUT_S promises clients: closed earlier, a client's pool may reuse it
    at the moment it closes). uvicorn times out only idle keep-alive connections (timeout_keep_alive), and only
    until the first byte of the next request: a client that connects and sends nothing, or dribbles a header a byte
    at a time (slowloris), holds its connection and its file for ever. Gunicorn and nginx bound this
    (client_header_timeout); this is that bound.

    Budget (web/connection_budget.py): a connection opened past its address's share, or past MAX_CONNECTIONS in
    all, answers 503 to everything but the probes.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from medgemma_xray.web.connection_budget import over_budget_app

    class GuardedProtocol(H11Protocol):
        _header_timer = None
        _budget_address: str | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if book is not None:
                address = self.client[0] if self.client else None
                refusal = book.admit(address, len(self.connections))
                if refusal is None:
                    self._budget_address = address
                else:
                    self.app = over_budget_app(self.app, refusal)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the request head is in: from here the application owns the pace

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm(max(header_timeout_s, keep_alive_s))

        def connection_lost(self, exc) -> None:
            self._disarm()
            if book is not None and self._budget_address is not None:
                book.release(self._budget_address)
                self._budget_address = None
            super().connection_lost(exc)

        def _arm(self, seconds: float = header_timeout_s) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

    return GuardedProtocol
