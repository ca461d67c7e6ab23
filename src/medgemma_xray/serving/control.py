"""Host-only control channel for the operator scripts: a Unix socket (0600) plus a token file (0600).

Protocol: one JSON object per line in, one per line out: {"token": ..., "command": "status" | "switch", ...}.
The public UI port has no route that can reach any of this.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import socket
import socketserver
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024


def token_path_for(socket_path: Path) -> Path:
    return Path(socket_path).with_suffix(".token")


class ControlServer:
    def __init__(self, service, socket_path: Path) -> None:
        self.service = service
        self.socket_path = Path(socket_path)
        self.token_path = token_path_for(self.socket_path)
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            self._refuse_if_live()
            self.socket_path.unlink()
        token = secrets.token_hex(32)
        descriptor = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(token + "\n")
        os.chmod(self.token_path, 0o600)
        handler = _make_handler(self.service, token)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            self._server = socketserver.ThreadingUnixStreamServer(str(self.socket_path), handler)
        finally:
            os.umask(old_umask)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="control", daemon=True)
        self._thread.start()
        logger.info("control channel on unix socket %s (0600, token file %s)", self.socket_path, self.token_path)

    def _refuse_if_live(self) -> None:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.socket_path))
        except OSError:
            return  # stale socket from a killed server
        finally:
            probe.close()
        raise RuntimeError(f"another server already listens on {self.socket_path}")

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for path in (self.socket_path, self.token_path):
            path.unlink(missing_ok=True)


def _make_handler(service, token: str):
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline(MAX_REQUEST_BYTES)
            try:
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("request must be a JSON object")
            except RecursionError:  # JSON nested thousands deep: the parser gives up; the reply says why
                logger.warning("control request refused: JSON nested too deeply")
                return self._reply({"ok": False, "error": "bad request: the JSON is nested too deeply"})
            except ValueError as exc:
                return self._reply({"ok": False, "error": f"bad request: {str(exc)[:200]}"})
            offered = str(request.get("token", ""))
            if not hmac.compare_digest(offered.encode(), token.encode()):
                logger.warning("control request refused: missing or wrong token")
                return self._reply({"ok": False, "error": "unauthorized: missing or wrong token"})
            self._reply(_dispatch(service, request))

        def _reply(self, payload: dict) -> None:
            self.wfile.write((json.dumps(payload, default=str) + "\n").encode())

    return Handler


def _dispatch(service, request: dict) -> dict:
    from dataclasses import asdict

    from medgemma_xray.inference_api.errors import RequestError
    from medgemma_xray.serving.service import SwitchError

    command = request.get("command")
    try:
        if command == "status":
            return {"ok": True, "status": service.status()}
        if command == "switch":
            record = service.switch_to(str(request.get("mode")), reason="operator request")
            return {
                "ok": True,
                "switch": {**asdict(record), "interruption_s": record.interruption_s},
                "status": service.status(),
            }
    except (SwitchError, RequestError) as exc:
        return {"ok": False, "error": str(exc), "status": service.status()}
    return {"ok": False, "error": f"unknown command {repr(command)[:40]}; valid: status, switch"}


def send_command(socket_path: Path, payload: dict, timeout_s: float = 600.0) -> dict:
    """Client side (used by the scripts): adds the token from the token file and returns the reply."""
    socket_path = Path(socket_path)
    token = token_path_for(socket_path).read_text().strip()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout_s)
        client.connect(str(socket_path))
        client.sendall((json.dumps({**payload, "token": token}) + "\n").encode())
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = client.recv(65536)
            if not chunk:
                break
            reply += chunk
    return json.loads(reply)
