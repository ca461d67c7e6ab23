"""The connection budget on a real server over real sockets: one client holding heartbeat streams past its share,
slow bodies that send a byte a second, and many clients filling MAX_CONNECTIONS, while /healthz and another
client's question are answered. Clients are told apart by their loopback source address (127.0.0.N)."""

from __future__ import annotations

import base64
import contextlib
import socket
import time

import httpx
import openai
import pytest

from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from tests.conftest import ServerProcess, start_server

pytestmark = pytest.mark.slow

MAX_CONNECTIONS = 32
PER_CLIENT = 8
BODY_TIMEOUT_S = 3
SECRET = "ZZBODYSECRET-7731"
FILM_URL = "data:image/png;base64," + base64.b64encode(png_bytes(quantize(chest_phantom(seed=5), 8))).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_model_dir) -> ServerProcess:
    env = {
        "MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "PER_CLIENT_CONNECTIONS": str(PER_CLIENT),
        "BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "HEADER_TIMEOUT_S": "60",  # the held connections below outlive the test's steps
        "MAX_NEW_TOKENS": "4",
    }
    server = start_server(tmp_path_factory.mktemp("budget"), env=env)
    yield server
    server.stop()


def open_from(server: ServerProcess, source: str) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))


def status_of(sock: socket.socket) -> int:
    """The status code of the response that starts on this socket."""
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(1024)
        if not chunk:
            return 0
        head += chunk
    return int(head.split(b" ", 2)[1])


def heartbeat(server: ServerProcess, source: str, index: int) -> tuple[socket.socket, int]:
    sock = open_from(server, source)
    sock.sendall(f"GET /gradio_api/heartbeat/hb{index:06d} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock, status_of(sock)


def others_are_answered(server: ServerProcess, source: str = "127.0.0.1") -> None:
    local = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=local, timeout=60) as client:
        assert client.get(f"{server.url}/healthz").status_code == 200
        assert client.get(f"{server.url}/v1/models").status_code == 200
    api = openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="none",
        max_retries=0,
        timeout=120,
        http_client=httpx.Client(transport=httpx.HTTPTransport(local_address=source)),
    )
    model = api.models.list().data[0].id
    question = [{"type": "image_url", "image_url": {"url": FILM_URL}}, {"type": "text", "text": "Findings?"}]
    reply = api.chat.completions.create(model=model, messages=[{"role": "user", "content": question}], max_tokens=4)
    assert reply.choices[0].message.content is not None


def test_one_client_holding_heartbeat_streams_gets_its_share_and_no_more(server):
    held = []
    try:
        statuses = []
        for index in range(3 * PER_CLIENT):
            sock, status = heartbeat(server, "127.0.0.2", index)
            held.append(sock)
            statuses.append(status)
        assert statuses[:PER_CLIENT] == [200] * PER_CLIENT, statuses
        assert set(statuses[PER_CLIENT:]) == {503}, statuses
        over = open_from(server, "127.0.0.2")  # over its share, the client still reaches the probes
        held.append(over)
        over.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(over) == 200
        others_are_answered(server)
    finally:
        for sock in held:
            sock.close()


def test_many_clients_filling_max_connections_leave_the_probes_answerable(server):
    held, statuses = [], []
    try:
        for client in range(MAX_CONNECTIONS // PER_CLIENT + 2):  # each within its share, together past the limit
            for index in range(PER_CLIENT):
                sock, status = heartbeat(server, f"127.0.1.{client + 1}", 1000 + client * 100 + index)
                held.append(sock)
                statuses.append(status)
        assert statuses.count(200) <= MAX_CONNECTIONS and 503 in statuses, statuses
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.2.1"), timeout=30) as newcomer:
            assert newcomer.get(f"{server.url}/healthz").status_code == 200
            assert newcomer.get(f"{server.url}/readyz").status_code == 200
            busy = newcomer.get(f"{server.url}/v1/models")
            assert busy.status_code == 503 and busy.headers["retry-after"], busy.text
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 60  # the server sees the closes; then everyone is served again
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 200:
                break
        time.sleep(0.5)
    others_are_answered(server, "127.0.2.2")


def test_a_body_sent_a_byte_a_second_is_cut_off_with_408(server):
    slow = []
    try:
        for _ in range(PER_CLIENT):
            sock = open_from(server, "127.0.0.3")
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n" + b'{"model": "' + SECRET.encode()
            )
            slow.append(sock)
        started = time.monotonic()
        for _ in range(BODY_TIMEOUT_S + 30):  # a byte a second, until the server answers
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"x")
            readable = []
            for sock in slow:
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    if sock.recv(1, socket.MSG_PEEK):
                        readable.append(sock)
                sock.setblocking(True)
            if len(readable) == len(slow):
                break
            time.sleep(1)
        for sock in slow:
            sock.settimeout(30)
            assert status_of(sock) == 408
        assert time.monotonic() - started < BODY_TIMEOUT_S + 30
        # the client may come back at once: its connections were released
        others_are_answered(server, "127.0.0.3")
    finally:
        for sock in slow:
            sock.close()
    assert SECRET not in server.log_text
