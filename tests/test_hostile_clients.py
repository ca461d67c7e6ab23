"""Hostile clients on a real server process over HTTP: slow connections while a
normal user works, the upload route's limits, routes the app does not need, uploads never served back, one answer
per conversation, and clean 400s for malformed calls with nothing of the client's input in the log."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize
from tests.conftest import ISOLATED_VARIABLES, REPO_ROOT, ServerProcess, free_port, start_server, wait_ready

pytestmark = pytest.mark.slow
SECRET_INPUT = "ZZCLIENTSECRET-4411"


@pytest.fixture(scope="module")
def film(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("film") / "film.dcm"
    path.write_bytes(dicom_bytes(quantize(chest_phantom(seed=7), 12), bits_stored=12, window=(2048, 4096)))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, random_model_dir) -> ServerProcess:
    # The random-weight demo writes every one of MAX_NEW_TOKENS, and the paced server floors each decode step at
    # TEST_DECODE_PACE_S: an answer lasts at least 48 s on any machine, so a question sent while it streams finds
    # it still running, however fast or loaded the machine is.
    env = {
        "MODEL_PATH": str(random_model_dir),
        "MAX_NEW_TOKENS": "48",
        "TEST_DECODE_PACE_S": "1.0",
        "MAX_FILES_PER_REQUEST": "4",
        "UPLOAD_CACHE_MAX_MB": "16",
        "UPLOAD_MAX_AGE_S": "10",
        "MAX_FILE_SIZE_MB": "8",
    }
    server = start_server(tmp_path_factory.mktemp("hostile"), env=env, script="tests/support/paced_server.py")
    yield server
    server.stop()


def upload(server: ServerProcess, *files: tuple[str, bytes]) -> httpx.Response:
    return httpx.post(f"{server.url}/gradio_api/upload", files=[("files", f) for f in files], timeout=60)


def test_one_upload_request_carries_at_most_the_file_limit(server):
    reply = upload(server, *[(f"f{i}.png", b"x" * 1000) for i in range(40)])
    assert reply.status_code == 413, reply.text
    assert "at most 4 files" in reply.json()["detail"]
    assert upload(server, *[(f"g{i}.png", b"y" * 1000) for i in range(3)]).status_code == 200


def test_the_upload_cache_has_a_byte_quota(server):
    statuses = [upload(server, (f"big{i}.bin", bytes([i]) * (3 << 20))).status_code for i in range(8)]
    assert statuses[:4] == [200] * 4, statuses  # 12 MiB of a 16 MiB quota
    assert 507 in statuses, statuses
    refused = upload(server, ("one-more.bin", b"z" * (3 << 20)))
    if refused.status_code == 507:
        assert "upload space is full" in refused.json()["detail"] and refused.headers["retry-after"] == "60"


def test_unread_uploads_expire(server):
    (stored,) = upload(server, ("expiring.png", b"e" * 1000)).json()
    deadline = time.monotonic() + 60
    while Path(stored).exists() and time.monotonic() < deadline:
        time.sleep(1)
        upload(server, ("tick.png", str(time.monotonic()).encode()))  # each upload sweeps expired ones
    assert not Path(stored).exists(), "an unread upload outlived UPLOAD_MAX_AGE_S=10"


def test_recording_and_deep_link_routes_are_gone(server):
    recorded = httpx.post(f"{server.url}/gradio_api/process_recording", files=[("audio", ("a.wav", b"RIFF"))])
    assert recorded.status_code == 404
    linked = httpx.get(f"{server.url}/gradio_api/deep_link", params={"session_hash": "anyone"})
    assert linked.status_code == 404


@pytest.mark.parametrize("name", ["ZZTESTPATIENT_SECRETNAME.png", "ZZ%41_SECRETNAME.png"])
def test_an_upload_is_never_served_back(server, name):
    """The second name carries a percent sign: its URL is the name percent-encoded once (%2541), which the server
    decodes once; decoded twice, the guard looked for another file and let this one be served."""
    from urllib.parse import quote

    (stored,) = upload(server, (name, b"\x89PNG not really")).json()
    fetched = httpx.get(f"{server.url}/gradio_api/file={quote(stored)}")
    assert fetched.status_code == 404
    assert "SECRETNAME" not in fetched.headers.get("content-disposition", "")


def test_a_second_question_in_one_session_is_told_to_wait(server, film):
    """Ask while an answer runs: refused at once with a message that says to wait or press Stop; the running answer
    is untouched, Stop ends it where it got to, and the next question is then taken."""
    client = Client(server.url, verbose=False)
    client.predict(handle_file(str(film)), api_name="/upload_film")
    first = client.submit("Describe the film in detail.", api_name="/ask")
    deadline = time.monotonic() + 120
    while not _streamed_text(first) and time.monotonic() < deadline:  # the first answer is streaming
        time.sleep(0.05)
    assert _streamed_text(first), "the first answer never started"
    with pytest.raises(Exception, match=r"still running\. Wait for it to finish \(or press Stop\)"):
        client.predict("And the heart?", api_name="/ask")
    assert not first.done(), "the refusal ended the running answer"
    client.predict(api_name="/stop")
    chat = first.result(timeout=300)[0]
    assert [turn["role"] for turn in chat] == ["user", "assistant"]
    assert "Stopped." in str(chat[-1]["content"])
    follow_up = client.submit("And the heart?", api_name="/ask")  # taken now that nothing runs
    while not _streamed_text(follow_up) and not follow_up.done() and time.monotonic() < deadline + 120:
        time.sleep(0.05)
    client.predict(api_name="/stop")
    assert [turn["role"] for turn in follow_up.result(timeout=300)[0]] == ["user", "assistant"] * 2


def test_an_example_index_out_of_range_gets_a_clean_message(server):
    """load_example with an index of 10^9: a message naming the examples there are, no IndexError traceback."""
    from medgemma_xray.assistant.case import EXAMPLE_QUESTIONS

    client = Client(server.url, verbose=False)
    with pytest.raises(Exception, match="There is no example question 1000000000; pick one of the 6 shown"):
        client.predict(10**9, api_name="/load_example")
    assert client.predict(2, api_name="/load_example") == EXAMPLE_QUESTIONS[2]
    assert "IndexError" not in server.log_text and "Traceback" not in server.log_text


def _streamed_text(job) -> str:
    outputs = job.outputs()
    if not outputs:
        return ""
    last = outputs[-1][0][-1]
    content = last["content"]
    text = " ".join(p.get("text", "") for p in content) if isinstance(content, list) else str(content)
    return text.strip() if last["role"] == "assistant" else ""


def test_malformed_calls_get_clean_400s_and_leave_no_trace_of_the_input(server):
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    replies = [
        httpx.post(f"{server.url}/gradio_api/queue/join", content=deep, timeout=30),
        httpx.post(
            f"{server.url}/gradio_api/queue/join",
            json={"data": [SECRET_INPUT], "fn_index": 99_999, "session_hash": "h1"},
            timeout=30,
        ),
        httpx.post(f"{server.url}/gradio_api/call/upload_film", json={"data": [SECRET_INPUT, None]}, timeout=30),
    ]
    for reply in replies:
        assert reply.status_code == 400, (reply.status_code, reply.text[:300])
        assert "Traceback" not in reply.text and SECRET_INPUT not in reply.text
    assert "nested too deeply" in replies[0].json()["detail"]
    assert "unknown fn_index" in replies[1].json()["detail"]
    assert "FileData" in replies[2].json()["detail"]
    logs = server.log_text
    assert SECRET_INPUT not in logs and "RecursionError" not in logs


def test_repeated_log_records_are_limited_and_earlier_lines_kept(tmp_path):
    """The filter the server installs (medgemma_xray.web.http_server.configure_logging): a flood from one log call keeps
    the first lines, a summary, and the file small; other records still pass."""
    log_file = tmp_path / "app.log"
    code = (
        "import logging, sys\n"
        "from pathlib import Path\n"
        "from medgemma_xray.web.http_server import configure_logging\n"
        f"configure_logging(Path({str(log_file)!r}))\n"
        "logging.getLogger('app').info('EARLIER LINE')\n"
        "flood = logging.getLogger('asyncio')\n"
        "for _ in range(100_000):\n"
        "    flood.error('socket.accept() out of system resource')\n"
        "logging.getLogger('app').info('LATER LINE')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = log_file.read_text()
    assert "EARLIER LINE" in text and "LATER LINE" in text
    assert text.count("out of system resource") < 200


def test_slow_connections_do_not_starve_a_normal_user(tmp_path, film):
    """300 connections that never finish their request head, under a soft limit of 256 open files (systemd's
    1,024 against 1,100 connections, scaled down): the server raises its own limit and closes them after
    HEADER_TIMEOUT_S, a normal user uploads and asks meanwhile, and the log keeps its first lines."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ISOLATED_VARIABLES}
    env.update({"LOG_DIR": str(log_dir), "HEADER_TIMEOUT_S": "5", "MAX_NEW_TOKENS": "4"})

    def low_file_limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    process = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port), "--log_file", str(log_dir / "gradio_app.log")],
        cwd=REPO_ROOT,
        env=env,
        stdout=open(log_dir / "console.log", "ab"),  # noqa: SIM115 (closed with the process)
        stderr=subprocess.STDOUT,
        preexec_fn=low_file_limit,
    )
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log_dir)
    slow: list[socket.socket] = []
    try:
        wait_ready(server.url, process)
        first_lines = (log_dir / "gradio_app.log").read_text().splitlines()[:2]
        for _ in range(300):
            # from another loopback address than the normal user's: another client, with its own budget
            sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            slow.append(sock)
        user_ok = threading.Event()
        failure: list[str] = []

        def normal_user() -> None:
            try:
                client = Client(server.url, verbose=False, httpx_kwargs={"timeout": 60})
                client.predict(handle_file(str(film)), api_name="/upload_film")
                chat = client.predict("Findings?", api_name="/ask")[0]
                assert chat[-1]["role"] == "assistant"
                user_ok.set()
            except Exception as exc:
                failure.append(repr(exc)[:300])

        user = threading.Thread(target=normal_user)
        user.start()
        user.join(timeout=240)
        assert user_ok.is_set(), failure or "the normal user was still waiting after 240 s"
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        closed = 0
        for sock in slow:  # the server closes each slow connection after HEADER_TIMEOUT_S (5 s)
            sock.settimeout(30)
            try:
                closed += sock.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
        assert closed == len(slow), f"{closed} of {len(slow)} slow connections closed by the server"
        text = (log_dir / "gradio_app.log").read_text()
        assert all(line in text for line in first_lines)
    finally:
        for sock in slow:
            sock.close()
        server.stop()
