"""The control socket answers hostile requests with one line of JSON saying what was wrong: JSON nested 100,000
deep, a huge unknown command. No traceback reaches the server's console, and the channel keeps answering."""

from __future__ import annotations

import json
import socket

import pytest

pytestmark = pytest.mark.slow


def ask(socket_path, line: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(60)
        client.connect(str(socket_path))
        client.sendall(line)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = client.recv(65536)
            if not chunk:
                break
            reply += chunk
    return json.loads(reply)


def test_deep_or_huge_requests_get_a_clear_error_and_no_traceback(demo_server):
    socket_path = demo_server.log_dir / "control.sock"
    token = (demo_server.log_dir / "control.token").read_text().strip()
    deep = ask(socket_path, b"[" * 100_000 + b"]" * 100_000 + b"\n")
    assert deep == {"ok": False, "error": "bad request: the JSON is nested too deeply"}
    huge = ask(socket_path, json.dumps({"token": token, "command": "x" * 50_000}).encode() + b"\n")
    assert huge["ok"] is False and "unknown command" in huge["error"] and len(huge["error"]) < 200
    status = ask(socket_path, json.dumps({"token": token, "command": "status"}).encode() + b"\n")
    assert status["ok"] is True, "the channel stopped answering"
    assert "Traceback" not in (demo_server.log_dir / "console.log").read_text(errors="replace")
