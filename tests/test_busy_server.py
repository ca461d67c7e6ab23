"""A real server with one decoding slot, a queue of one and a short answer time limit: a full queue is told to
retry in a minute (no hang), and an answer that runs too long is stopped with a message."""

from __future__ import annotations

import time

import httpx
import pytest
from gradio_client import Client, handle_file

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize
from tests.conftest import start_server

BUSY_MESSAGE = "The server is busy: every place in the queue is taken. Please retry in a minute."

pytestmark = pytest.mark.slow

TIMEOUT_S = 4
# Every decode step takes at least this long (tests/support/paced_server.py), so an answer of MAX_NEW_TOKENS needs
# at least 2048 x 10 ms = 20 s on any machine, far past the limit: the test no longer depends on the machine's speed.
DECODE_PACE_S = 0.010


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory, random_model_dir):
    env = {
        "GENERATION_CONCURRENCY": "1",
        "QUEUE_SIZE": "1",
        "REQUEST_TIMEOUT_S": str(TIMEOUT_S),
        "MAX_NEW_TOKENS": "2048",
        "MODEL_PATH": str(random_model_dir),  # answers that run to the limit: the trained demo stops early
        "TEST_DECODE_PACE_S": str(DECODE_PACE_S),
    }
    server = start_server(tmp_path_factory.mktemp("busy"), env=env, script="tests/support/paced_server.py")
    yield server
    server.stop()


def client_with_film(server, tmp_path, seed: int) -> Client:
    film = tmp_path / f"film{seed}.dcm"
    film.write_bytes(dicom_bytes(quantize(chest_phantom(seed=seed), 12), bits_stored=12))
    client = Client(server.url, verbose=False)
    client.predict(handle_file(str(film)), api_name="/upload_film")
    return client


def test_full_queue_says_retry_in_a_minute_and_long_answers_stop_at_the_limit(busy_server, tmp_path):
    first, second = client_with_film(busy_server, tmp_path, 1), client_with_film(busy_server, tmp_path, 2)
    started = time.monotonic()
    running = first.submit("Describe everything on this film.", api_name="/ask")
    while running.status().code.name not in ("PROCESSING", "ITERATING") and time.monotonic() - started < 30:
        time.sleep(0.1)
    waiting = second.submit("And the heart?", api_name="/ask")  # takes the one place in the queue
    while waiting.status().code.name != "IN_QUEUE":  # Gradio's queue of QUEUE_SIZE places, not a fixed sleep
        assert time.monotonic() - started < 60, "the second question never reached the queue"
        time.sleep(0.05)

    refused = httpx.post(f"{busy_server.url}/gradio_api/call/ask", json={"data": ["Anything?", None]}, timeout=10)
    assert not running.done(), "the refusal came at once, while the first answer was still running"
    assert refused.status_code == 503, refused.text
    assert refused.json()["detail"] == BUSY_MESSAGE
    assert refused.headers["retry-after"] == "60"

    with pytest.raises(Exception, match=f"not finished {TIMEOUT_S} s after it started"):
        running.result(timeout=120)
    assert time.monotonic() - started >= TIMEOUT_S  # the message above says the limit, not completion, stopped it
    partial = running.outputs()[-1][0][-1]["content"]
    assert partial, "the part streamed before the limit was shown"
    with pytest.raises(Exception, match=f"not finished {TIMEOUT_S} s after it started"):
        waiting.result(timeout=120)  # then the queued one ran, under the same limit
    assert "Traceback" not in busy_server.log_text
