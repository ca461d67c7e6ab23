"""Take the UI port before the model loads, and hand the bound socket to uvicorn.

Binding first means a taken port fails in a fraction of a second instead of after minutes of loading, and no
other program can take the port while the model loads (connections are refused until uvicorn listens).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path


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
