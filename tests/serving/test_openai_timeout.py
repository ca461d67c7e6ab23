"""An answer that runs past REQUEST_TIMEOUT_S is a 504 in OpenAI's shape, not a 429 or 503 "busy": the client
should ask for less, not merely retry. The server's time limit is 0.1 s, which no 2048-token answer meets."""

from __future__ import annotations

import base64

import httpx
import pytest

from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from tests.conftest import start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory, random_model_dir):
    env = {"MODEL_PATH": str(random_model_dir), "REQUEST_TIMEOUT_S": "0.1", "MAX_NEW_TOKENS": "2048"}
    server = start_server(tmp_path_factory.mktemp("openai-timeout") / "logs", env=env)
    yield server
    server.stop()


def test_a_timed_out_answer_is_504(server):
    film = "data:image/png;base64," + base64.b64encode(png_bytes(quantize(chest_phantom(seed=2), 8))).decode()
    question = {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": film}}, {"type": "text", "text": "Describe it all."}],
    }
    model = httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"][0]["id"]
    reply = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": model, "messages": [question], "max_tokens": 2048},
        timeout=120,
    )
    assert reply.status_code == 504, reply.text
    error = reply.json()["error"]
    assert error["code"] == "answer_timeout" and error["type"] == "timeout_error"
    assert "server is busy" not in error["message"] and "max_completion_tokens" in error["message"]
