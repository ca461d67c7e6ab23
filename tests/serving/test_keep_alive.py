"""An idle keep-alive connection outlives the pools of the usual clients. At uvicorn's 5 s, which is also how long
httpx (and so the openai client) keeps an idle connection, a client sometimes sent its next request on a
connection the server was closing at that instant: the request failed with "Server disconnected without sending a
response" and never reached the server (1 in 70 requests sent 4.95-5.05 s apart, and one answer in the soak)."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

pytestmark = pytest.mark.slow


def _exchange(sock: socket.socket, host: str) -> bytes:
    """One GET /healthz on an open connection; the whole response (its length is known from its headers)."""
    sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


AIOHTTP_POOL_EXPIRY_S = 15.0  # aiohttp's TCPConnector keepalive_timeout default


@pytest.mark.parametrize("client", ["httpx (the openai client)", "aiohttp"])
def test_a_connection_idle_past_a_clients_pool_expiry_still_answers(demo_server, client):
    """Idle longer than the client keeps a connection in its pool, so the client has dropped it by then; the
    server has not closed it yet (HEADER_TIMEOUT_S, 10 s, is shorter than aiohttp's 15 s: the head timer after a
    response must follow KEEP_ALIVE_TIMEOUT_S)."""
    address = urlparse(demo_server.url)
    pool_expiry_s = (httpx.Limits().keepalive_expiry or 5.0) if client.startswith("httpx") else AIOHTTP_POOL_EXPIRY_S
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        assert _exchange(sock, address.netloc).startswith(b"HTTP/1.1 200")
        time.sleep(pool_expiry_s + 1)
        again = _exchange(sock, address.netloc)
    assert again.startswith(b"HTTP/1.1 200"), "the server closed an idle connection that a client may still reuse"
