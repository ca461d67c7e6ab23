"""The upload route on a real server, attacked with raw HTTP: one multipart parse counts and stores, so a second
boundary parameter cannot carry more files than the limit; every chunk is reserved before it is written, so uploads
sent at once cannot together pass UPLOAD_CACHE_MAX_MB; a refused request (too many files, a file too large, a client
that hangs up part-way) leaves nothing on disk."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, start_server

pytestmark = pytest.mark.slow
MAX_FILES = 4
QUOTA_MB = 16
MAX_FILE_MB = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory, random_model_dir) -> ServerProcess:
    env = {
        "MODEL_PATH": str(random_model_dir),
        "MAX_FILES_PER_REQUEST": str(MAX_FILES),
        "UPLOAD_CACHE_MAX_MB": str(QUOTA_MB),
        "MAX_FILE_SIZE_MB": str(MAX_FILE_MB),
        "UPLOAD_MAX_AGE_S": "600",
    }
    server = start_server(tmp_path_factory.mktemp("upload-route"), env=env)
    yield server
    server.stop()


def cache_files(server: ServerProcess) -> dict[Path, int]:
    """Every file in the server's upload cache but its marker, with its size."""
    folder = server.log_dir / "upload-cache"
    return {path: path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.name.startswith(".")}


def clear_cache(server: ServerProcess) -> None:
    for path in cache_files(server):
        path.unlink(missing_ok=True)


def multipart(boundary: str, files: list[tuple[str, bytes]]) -> bytes:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n".encode()
        + content
        + b"\r\n"
        for name, content in files
    ]
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


def raw_post(server: ServerProcess, content_type: str, body: bytes) -> tuple[int, bytes]:
    reply = httpx.post(
        f"{server.url}/gradio_api/upload", content=body, headers={"content-type": content_type}, timeout=120
    )
    return reply.status_code, reply.content


def test_a_second_boundary_parameter_cannot_carry_more_files_than_the_limit(server):
    clear_cache(server)
    files = [(f"f{i}.png", bytes([i]) * 1000) for i in range(40)]
    for content_type in (
        "multipart/form-data; boundary=decoy; boundary=real",  # the parser reads the last: 40 files seen, 413
        "multipart/form-data; boundary=real",
    ):
        status, body = raw_post(server, content_type, multipart("real", files))
        assert status == 413, (content_type, status, body[:200])
        assert b"at most 4 files" in body
    # The real boundary first: the parser finds no part under "decoy" and refuses the body as malformed.
    status, body = raw_post(server, 'multipart/form-data; boundary="real"; boundary=decoy', multipart("real", files))
    assert status == 400 and b"malformed" in body, (status, body[:200])
    assert cache_files(server) == {}, "a refused upload left files behind"
    status, body = raw_post(server, "multipart/form-data; boundary=real", multipart("real", files[:MAX_FILES]))
    assert status == 200 and len(httpx.Response(200, content=body).json()) == MAX_FILES


def test_uploads_sent_at_once_cannot_together_pass_the_quota(server):
    """Eight requests of 6 MiB each against a 16 MiB quota, each with its head and first bytes sent before any
    sends the rest: every one is past the quota check at its start, so only reservation per chunk holds."""
    clear_cache(server)
    host, port = server.url.removeprefix("http://").split(":")
    bodies = [  # distinct content: the cache stores one copy of identical files
        multipart("b0undary", [("a.bin", bytes([i]) * (3 << 20)), ("b.bin", bytes([100 + i]) * (3 << 20))])
        for i in range(8)
    ]
    connections = []
    for body in bodies:
        head = (
            f"POST /gradio_api/upload HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: multipart/form-data; boundary=b0undary\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        connection = socket.create_connection((host, int(port)), timeout=120)
        connection.sendall(head + body[:1024])
        connections.append((connection, body))
    statuses: list[int] = []

    def finish(connection: socket.socket, body: bytes) -> None:
        """Send the rest while another thread reads: a refused request is answered before its body is read."""
        reply = bytearray()

        def read() -> None:
            with contextlib.suppress(OSError):
                while chunk := connection.recv(65536):
                    reply.extend(chunk)

        reader = threading.Thread(target=read)
        reader.start()
        with contextlib.suppress(OSError):  # refused part-way: the server answered and closed
            connection.sendall(body[1024:])
        reader.join(180)
        connection.close()
        statuses.append(int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0)

    senders = [threading.Thread(target=finish, args=pair) for pair in connections]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(180)
    assert 200 in statuses and 507 in statuses and set(statuses) <= {200, 507, 0}, statuses  # 0: reset unanswered
    assert sum(cache_files(server).values()) <= QUOTA_MB << 20, "uploads at once stored more than the quota"
    assert statuses.count(200) <= QUOTA_MB // 6, statuses


def test_a_refused_request_leaves_nothing_on_disk(server):
    clear_cache(server)
    megabyte = b"m" * (1 << 20)
    cases = {
        "one file too many": [(f"m{i}.bin", megabyte) for i in range(MAX_FILES + 1)],
        "a file over the size limit": [("small.bin", megabyte), ("big.bin", b"B" * ((MAX_FILE_MB + 1) << 20))],
    }
    for label, files in cases.items():
        status, body = raw_post(server, "multipart/form-data; boundary=xyz", multipart("xyz", files))
        assert status == 413, (label, status, body[:200])
        assert cache_files(server) == {}, f"{label}: the refused request's files were kept"


def test_a_client_that_hangs_up_part_way_leaves_nothing_on_disk(server):
    clear_cache(server)
    host, port = server.url.removeprefix("http://").split(":")
    body = multipart("hang", [("part.bin", b"p" * (4 << 20))])
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(
            f"POST /gradio_api/upload HTTP/1.1\r\nHost: {host}\r\nContent-Type: multipart/form-data; boundary=hang\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[: 2 << 20]
        )
        deadline = time.monotonic() + 60
        while not cache_files(server) and time.monotonic() < deadline:  # the server is writing the part
            time.sleep(0.05)
        assert cache_files(server), "the server never started writing the upload"
    deadline = time.monotonic() + 60
    while cache_files(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cache_files(server) == {}, "a hung-up upload's partial file was kept"
    status, _ = raw_post(server, "multipart/form-data; boundary=ok", multipart("ok", [("again.bin", b"x" * (8 << 20))]))
    assert status == 200, "the hung-up request's reservation was not given back"
