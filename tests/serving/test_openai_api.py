"""The OpenAI-compatible API on a real server, through the official openai client: streaming and not, PNG and
DICOM films as data: URLs, log-probabilities and confidence, a follow-up that reuses the conversation's KV, refused
remote URLs and bad files in OpenAI's error shape, the login as a bearer token, and a full queue (503 with
Retry-After). The server runs the random-weight demo (answers run to max_tokens), one decoding slot, a queue of one.
"""

from __future__ import annotations

import base64
import io
import threading

import httpx
import openai
import pytest

from devtools.hostile_files import FAKE_IDENTIFIERS
from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize
from medgemma_xray.web.http_auth import add_user
from tests.conftest import start_server

pytestmark = pytest.mark.slow

PASSWORD = "api-test-password"
API_KEY = f"teacher:{PASSWORD}"


def noise_png() -> bytes:
    import numpy as np

    return png_bytes(np.random.default_rng(0).integers(0, 256, (512, 512), dtype=np.uint8))


def data_url(kind: str, content: bytes) -> str:
    return f"data:{kind};base64,{base64.b64encode(content).decode()}"


def identified_dicom(seed: int = 3) -> bytes:
    import pydicom

    data = dicom_bytes(quantize(chest_phantom(seed=seed), 12), bits_stored=12, window=(2048, 4096))
    dataset = pydicom.dcmread(io.BytesIO(data))
    for keyword, value in FAKE_IDENTIFIERS.items():
        setattr(dataset, keyword, value)
    buffer = io.BytesIO()
    dataset.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def film_message(url: str, question: str) -> dict:
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory, random_model_dir):
    folder = tmp_path_factory.mktemp("openai")
    add_user(folder / "credentials", "teacher", PASSWORD)
    add_user(folder / "credentials", "resident", PASSWORD)
    env = {
        "MODEL_PATH": str(random_model_dir),
        "AUTH_FILE": str(folder / "credentials"),
        "GENERATION_CONCURRENCY": "1",
        "QUEUE_SIZE": "1",
        "MAX_NEW_TOKENS": "2048",
    }
    server = start_server(folder / "logs", env=env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client) -> str:
    models = client.models.list().data
    assert len(models) == 1 and models[0].owned_by == "medgemma-xray-assistant"
    assert models[0].id == "medgemma-xray-demo", "a plain id; what serves is described beside it"
    return models[0].id


def test_a_png_answer_with_logprobs_and_confidence_and_the_same_answer_streamed(client, model):
    messages = [film_message(data_url("image/png", png_bytes(quantize(chest_phantom(seed=1), 8))), "What do you see?")]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=12, logprobs=True)
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 12
    tokens = choice.logprobs.content
    assert len(tokens) == 12 and all(entry.logprob <= 0 for entry in tokens)
    assert "".join(entry.token for entry in tokens) == choice.message.content
    confidence = whole.model_extra["medgemma"]["confidence"]
    assert confidence["tokens"] == 12 and 0 <= confidence["min_probability"] <= confidence["mean_probability"] <= 1

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=12,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1, "the answer came in pieces"
    assert text == choice.message.content  # greedy: the same answer through the same scheduler
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in tokens], abs=1e-4)
    assert chunks[-1].usage.completion_tokens == 12
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[0].model_extra["medgemma"]["confidence"]["tokens"] == 12


def test_a_dicom_follow_up_reuses_the_conversation_and_no_identifier_reaches_the_log(client, model, server):
    film = data_url("application/dicom", identified_dicom())
    first = [film_message(film, "Is there a pneumothorax?")]
    answer = client.chat.completions.create(
        model=model, messages=first, max_tokens=6, extra_body={"conversation_id": "case-17"}
    )
    assert answer.usage.prompt_tokens_details.cached_tokens == 0
    issued = answer.model_extra["medgemma"]["conversation_id"]
    assert issued.startswith("mgx-"), "the server issues the conversation's id"
    follow_up = [*first, {"role": "assistant", "content": answer.choices[0].message.content}]
    follow_up.append({"role": "user", "content": "And the heart?"})
    stream = client.chat.completions.create(
        model=model, messages=follow_up, max_tokens=6, stream=True, extra_body={"conversation_id": issued}
    )
    final = [c for c in stream if c.choices and c.choices[0].finish_reason][0]
    reused = final.model_extra["medgemma"]["reused_tokens"]
    assert reused > answer.usage.prompt_tokens // 2, "the follow-up prefilled only its new tokens"
    log = server.log_text
    for value in FAKE_IDENTIFIERS.values():
        assert value not in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    "url, expected, code",
    [
        ("https://example.org/film.png", "this server fetches nothing", "remote_image_url_refused"),
        ("http://127.0.0.1:1/film.dcm", "this server fetches nothing", "remote_image_url_refused"),
        (data_url("image/png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64), "PNG", "not_an_image"),
        (data_url("application/dicom", b"\0" * 128 + b"DICM" + b"\x02\x00"), "DICOM", "not_an_image"),
        ("data:image/png;base64,@@@not-base64@@@", "base64 payload is damaged", "invalid_image_url"),
        (data_url("image/png", noise_png()), "does not look like a frontal chest X-ray", "not_a_chest_film"),
    ],
    ids=["https", "http", "truncated-png", "truncated-dicom", "bad-base64", "noise-not-a-chest-film"],
)
def test_remote_urls_and_bad_files_are_refused_in_openai_shape(client, model, url, expected, code):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=[film_message(url, "Findings?")], max_tokens=4)
    error = refused.value.body
    assert expected.lower() in error["message"].lower(), error
    assert error["code"] == code, error
    assert refused.value.response.json()["error"]["type"] == "invalid_request_error"
    assert "Traceback" not in error["message"] and "Internal error" not in error["message"]


def test_a_conversation_id_is_bound_to_the_login_that_started_it(client, server, model):
    first = [film_message(data_url("image/png", png_bytes(quantize(chest_phantom(seed=5), 8))), "Effusion?")]
    answer = client.chat.completions.create(
        model=model, messages=first, max_tokens=2, extra_body={"conversation_id": "a"}
    )
    issued = answer.model_extra["medgemma"]["conversation_id"]
    follow_up = [*first, {"role": "assistant", "content": answer.choices[0].message.content}]
    follow_up.append({"role": "user", "content": "Which side?"})
    resident = openai.OpenAI(base_url=f"{server.url}/v1", api_key=f"resident:{PASSWORD}", max_retries=0, timeout=120)
    other = resident.chat.completions.create(
        model=model, messages=follow_up, max_tokens=2, extra_body={"conversation_id": issued}
    )
    assert other.usage.prompt_tokens_details.cached_tokens == 0, "another login learns nothing from the teacher's KV"
    assert other.model_extra["medgemma"]["conversation_id"] != issued
    own = client.chat.completions.create(
        model=model, messages=follow_up, max_tokens=2, extra_body={"conversation_id": issued}
    )
    assert own.usage.prompt_tokens_details.cached_tokens > 0


def test_the_login_is_a_bearer_token(server, model):
    film = data_url("image/png", png_bytes(quantize(chest_phantom(seed=2), 8)))
    for key in ("teacher:wrong-password", "no-colon"):
        anonymous = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anonymous.chat.completions.create(model=model, messages=[film_message(film, "Findings?")], max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            anonymous.models.list()
    assert PASSWORD not in server.log_text


def test_a_full_queue_is_503_with_retry_after(client, model, server):
    film = data_url("image/png", png_bytes(quantize(chest_phantom(seed=4), 8)))
    started, streams = threading.Event(), []

    def long_answer(seed: int) -> None:  # holds the one slot (and then the one queue place) until closed
        stream = client.chat.completions.create(
            model=model, messages=[film_message(film, f"Describe everything {seed}.")], max_tokens=2048, stream=True
        )
        streams.append(stream)
        started.set()

    long_answer(1)  # headers arrive with the first token: it runs
    assert started.wait(60)
    waiting = threading.Thread(target=long_answer, args=(2,))  # waits for the slot: it holds the queue place
    waiting.start()
    try:
        refused = None
        for _ in range(200):  # the queued request needs a moment to reach the scheduler
            reply = httpx.post(
                f"{server.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {API_KEY}"},
                json={"model": model, "messages": [film_message(film, "Anything?")], "max_tokens": 2},
                timeout=60,
            )
            if reply.status_code == 503:
                refused = reply
                break
            assert reply.status_code == 200, reply.text
        assert refused is not None, "the third request was never refused"
        assert refused.headers["retry-after"] == "60"
        assert refused.json()["error"]["code"] == "server_busy" and "retry" in refused.json()["error"]["message"]
        with pytest.raises(openai.InternalServerError) as busy:  # the openai client's class for any 5xx
            client.chat.completions.create(model=model, messages=[film_message(film, "Anything?")], max_tokens=2)
        assert busy.value.status_code == 503 and busy.value.body["code"] == "server_busy"
    finally:
        for stream in streams:
            stream.close()  # closing the connection cancels the answer and frees the slot
        waiting.join(120)
        for stream in streams:
            stream.close()
