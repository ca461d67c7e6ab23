"""Wrong keys against a real server with a login file: 48 clients guessing at both doors (the API's bearer key and
the pages' /login) leave /healthz answering, and one address's sixth wrong try is refused (429, Retry-After, in
OpenAI's error shape at the API) before any scrypt, while another address still logs in."""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time

import httpx
import pytest

from medgemma_xray.web.login_guard import FREE_FAILURES
from tests.conftest import REPO_ROOT, ServerProcess, start_server

pytestmark = pytest.mark.slow

PASSWORD = "ward round 2026"
GUESSERS = 48
HEALTHZ_BOUND_S = 10  # generous: on the event loop, scrypt held /healthz for a median 10 s and up to 60 s


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
    server = start_server(folder / "logs", env={"AUTH_FILE": str(credentials)})
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
