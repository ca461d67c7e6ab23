"""Wrong keys against a real server with a login file: 48 clients guessing at both doors (the API's bearer key and
the pages' /login) leave /healthz answering, and one address's sixth wrong try is refused (429, Retry-After, in
OpenAI's error shape at the API) before any scrypt, while another address still logs in."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import pytest

from medgemma_xray.web.login_guard import FREE_FAILURES
from tests.conftest import REPO_ROOT, ServerProcess, start_server
from tests.test_connection_budget import status_of

pytestmark = pytest.mark.slow

PASSWORD = "ward round 2026"
GUESSERS = 48
HEALTHZ_BOUND_S = 10
PER_LOGIN = 8  # generous: on the event loop, scrypt held /healthz for a median 10 s and up to 60 s


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_model_dir) -> ServerProcess:
    folder = tmp_path_factory.mktemp("login")
    credentials = folder / "credentials"
    added = subprocess.run(
        [sys.executable, "-m", "medgemma_xray.web.http_auth", "add", "--file", str(credentials), "--user", "teacher"],
        cwd=REPO_ROOT,
        input=PASSWORD + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    second = subprocess.run(
        [sys.executable, "-m", "medgemma_xray.web.http_auth", "add", "--file", str(credentials), "--user", "student"],
        cwd=REPO_ROOT,
        input=PASSWORD + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 0, second.stderr
    env = {"AUTH_FILE": str(credentials), "PER_CLIENT_CONNECTIONS": str(PER_LOGIN)}
    server = start_server(folder / "logs", env=env)
    yield server
    server.stop()


def client_from(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=120)


def test_48_clients_with_wrong_keys_leave_healthz_answering(server):
    stop = threading.Event()
    guesses: list[int] = []

    def guesser(index: int) -> None:
        with client_from(f"127.0.4.{index + 1}") as client:
            attempt = 0
            while not stop.is_set():
                attempt += 1
                if index % 2:
                    reply = client.get(
                        f"{server.url}/v1/models", headers={"Authorization": f"Bearer teacher:guess-{attempt}"}
                    )
                else:
                    reply = client.post(f"{server.url}/login", data={"username": "teacher", "password": f"g{attempt}"})
                guesses.append(reply.status_code)

    threads = [threading.Thread(target=guesser, args=(index,)) for index in range(GUESSERS)]
    for thread in threads:
        thread.start()
    latencies = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert httpx.get(f"{server.url}/healthz", timeout=120).status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=300)
    assert len(guesses) >= GUESSERS, "the guessers ran"
    assert set(guesses) <= {400, 401, 429} and {400, 401} & set(guesses), sorted(set(guesses))
    print(
        f"/healthz under {GUESSERS} guessers: median {statistics.median(latencies):.3f} s, max {max(latencies):.3f} s"
    )
    assert max(latencies) < HEALTHZ_BOUND_S, latencies


def test_the_sixth_wrong_key_from_one_address_is_throttled_at_both_doors(server):
    with client_from("127.0.5.1") as api:
        for attempt in range(FREE_FAILURES):
            wrong = api.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer teacher:nope-{attempt}"})
            assert wrong.status_code == 401, wrong.text
        throttled = api.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer teacher:nope-6"})
        assert throttled.status_code == 429, throttled.text
        error = throttled.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "too_many_failed_logins"
        assert int(throttled.headers["retry-after"]) > 0 and "Try again in" in error["message"]
        right = api.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer teacher:{PASSWORD}"})
        assert right.status_code == 429, "a throttled address waits, whatever it sends"
    with client_from("127.0.5.2") as page:
        for attempt in range(FREE_FAILURES):
            assert (
                page.post(f"{server.url}/login", data={"username": "teacher", "password": f"x{attempt}"}).status_code
                == 400
            )
        throttled = page.post(f"{server.url}/login", data={"username": "teacher", "password": "x6"})
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) > 0
        assert "Too many failed logins" in throttled.json()["detail"]
    with client_from("127.0.5.3") as other:  # another address logs in at both doors
        assert (
            other.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer teacher:{PASSWORD}"}).status_code
            == 200
        )
        assert other.post(f"{server.url}/login", data={"username": "teacher", "password": PASSWORD}).status_code == 200
    assert PASSWORD not in server.log_text


def test_one_login_on_many_addresses_holds_at_most_its_share(server):
    with client_from("127.0.8.1") as page:
        logged_in = page.post(f"{server.url}/login", data={"username": "teacher", "password": PASSWORD})
        assert logged_in.status_code == 200, logged_in.text
        cookie = "; ".join(f"{name}={value}" for name, value in page.cookies.items())
        by_key = page.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer teacher:{PASSWORD}"})
        assert by_key.status_code == 200, "the same login's API key, checked once"
    host, port = server.url.removeprefix("http://").split(":")
    held, statuses = [], []
    try:
        for index in range(PER_LOGIN + 4):  # each from its own address: the address budget is not what stops it
            sock = socket.create_connection((host, int(port)), timeout=30, source_address=(f"127.0.8.{index + 2}", 0))
            held.append(sock)
            sock.sendall(
                f"GET /gradio_api/heartbeat/login{index} HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n\r\n".encode()
            )
            statuses.append(status_of(sock))
        assert statuses[:PER_LOGIN] == [200] * PER_LOGIN and set(statuses[PER_LOGIN:]) == {503}, statuses
        with client_from("127.0.8.100") as elsewhere:  # the probes, and another login, are answered
            assert elsewhere.get(f"{server.url}/healthz", headers={"Cookie": cookie}).status_code == 200
            other = elsewhere.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer student:{PASSWORD}"})
            assert other.status_code == 200, other.text
            busy = elsewhere.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer teacher:{PASSWORD}"})
            assert busy.status_code == 503 and busy.headers["retry-after"], "the same login, by its API key"
    finally:
        for sock in held:
            sock.close()
