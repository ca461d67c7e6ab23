"""Ray Serve on CPU with real Ray (`medgemma-xray-ray start deploy/ray/medgemma-cpu-demo.yaml`): two replicas of the demo
model behind one ingress. 8 clients in their own conversations: every follow-up lands on the replica holding its
KV (reused tokens > 0). One replica is killed (SIGKILL) during an answer: only that answer fails, with a clear
retryable error; the conversations go on elsewhere after a re-prefill; Serve restarts the replica and both answer.
The UI answers through the same ingress, and the control command reaches each replica.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from tests.conftest import REPO_ROOT
from tests.scaleout.cluster_harness import RayCluster
from tests.test_app_e2e import answer_text

pytestmark = pytest.mark.slow

CLIENTS = 8
RETRYABLE = "Ask again: the conversation continues on another replica."
ANSWER_LIMIT = 256  # tokens: seconds on a CPU replica, against milliseconds from a token to the SIGKILL


def film_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(quantize(chest_phantom(seed=seed), 8))).decode()


class ServeApp(RayCluster):
    """The CPU configuration started as the docs say (medgemma-xray-ray start), with the random-weight checkpoint:
    it never stops early, so an answer runs to its limit and the replica killed after an answer's second token is
    still answering (the trained demo's short answers could end first)."""

    def __init__(self, folder: Path, model_dir: Path, **app_args) -> None:
        """app_args: more of the application's arguments (settings in lower case), over max_new_tokens."""
        super().__init__(folder, model_dir, replicas=2, extra_args={"max_new_tokens": ANSWER_LIMIT, **app_args})
        self.env = {**self.env, "RAY_ADDRESS": f"127.0.0.1:{self.gcs_port}"}

    def replicas(self) -> list[dict]:
        try:
            return httpx.get(f"{self.url}/replicas", timeout=5).json()["replicas"]
        except (httpx.HTTPError, ValueError, KeyError):
            return []

    def wait_for_replicas(self, count: int, timeout_s: float = 600, exclude: set[str] = frozenset()) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready = [r for r in self.replicas() if r.get("ready") and r["id"] not in exclude]
            if len(ready) >= count:
                return ready
            time.sleep(1)
        raise TimeoutError(f"{count} replicas not ready; Ray's logs are in {self.ray_folder}")


@pytest.fixture(scope="module")
def serve_app(tmp_path_factory, random_model_dir):
    app = ServeApp(tmp_path_factory.mktemp("ray"), random_model_dir)  # every answer runs to its limit
    try:
        app.wait_for_replicas(2)
        yield app
    finally:
        app.stop()


class Conversation:
    def __init__(self, client: openai.OpenAI, model: str, index: int) -> None:
        self.client, self.model, self.id = client, model, f"ward-{index}"
        self.messages: list[dict] = [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": film_url(100 + index)}},
                    {"type": "text", "text": "What are the main findings?"},
                ],
            }
        ]
        self.answers: list[dict] = []  # {"replica", "reused"}

    def ask(self, max_tokens: int = 8) -> dict:
        reply = self.client.chat.completions.create(
            model=self.model, messages=self.messages, max_tokens=max_tokens, extra_body={"conversation_id": self.id}
        )
        extension = reply.model_extra["medgemma"]
        self.id = extension["conversation_id"]  # the id the server issued: follow-ups continue with it
        self.messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        self.messages.append({"role": "user", "content": f"And question {len(self.answers) + 2}?"})
        record = {"replica": extension["replica"], "reused": reply.usage.prompt_tokens_details.cached_tokens}
        self.answers.append(record)
        return record


def pid_of(replica_name: str) -> int:
    return int(replica_name.rsplit(":", 1)[1])


def run_all(conversations, turns: int, lost: list, failures: list) -> None:
    def client(conversation: Conversation) -> None:
        for _ in range(turns):
            for attempt in range(3):
                try:
                    conversation.ask()
                    break
                except openai.APIError as exc:
                    if RETRYABLE in str(exc) and attempt < 2:
                        lost.append((conversation.id, str(exc)))
                        continue  # the same question again: the conversation continues elsewhere
                    failures.append((conversation.id, f"{type(exc).__name__}: {exc}"))
                    return

    threads = [threading.Thread(target=client, args=(c,)) for c in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)


def test_follow_ups_stay_with_their_kv_and_a_killed_replica_loses_only_its_answer_in_flight(serve_app, tmp_path):
    client = openai.OpenAI(base_url=f"{serve_app.url}/v1", api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    conversations = [Conversation(client, model, index) for index in range(CLIENTS)]

    lost, failures = [], []
    run_all(conversations, 3, lost, failures)  # a first question and two follow-ups each
    assert not failures and not lost, (failures, lost)
    for conversation in conversations:
        first, *follow_ups = conversation.answers
        assert first["reused"] == 0
        for answer in follow_ups:
            assert answer["replica"] == first["replica"], f"{conversation.id} moved off the replica holding its KV"
            assert answer["reused"] > 0, f"{conversation.id}'s follow-up re-prefilled its conversation"

    # Kill the replica holding the most conversations, while one of its answers streams.
    holders = [c.answers[-1]["replica"] for c in conversations]
    victim = max(set(holders), key=holders.count)
    moved = [c for c in conversations if c.answers[-1]["replica"] == victim]
    streaming = moved[0]
    stream = client.chat.completions.create(
        model=model,
        messages=streaming.messages,
        max_tokens=ANSWER_LIMIT,
        stream=True,
        extra_body={"conversation_id": streaming.id},
    )
    iterator = iter(stream)
    next(iterator), next(iterator)  # the answer is running on the victim, ANSWER_LIMIT tokens from its end
    os.kill(pid_of(victim), signal.SIGKILL)
    with pytest.raises(openai.APIError, match=RETRYABLE):
        for _ in iterator:
            pass

    run_all(conversations, 2, lost, failures)  # everyone goes on, the victim's conversations elsewhere
    assert not failures, failures
    assert len(lost) <= len(moved), f"only answers in flight on the killed replica may fail: {lost}"
    for conversation in moved:
        after = conversation.answers[3:]
        assert after[0]["replica"] != victim and after[0]["reused"] == 0, "a transparent re-prefill elsewhere"
        assert after[1]["replica"] == after[0]["replica"] and after[1]["reused"] > 0, "then its KV is used again"
    for conversation in conversations:
        assert len(conversation.answers) == 5

    # Serve restarts the killed replica; both answer new conversations.
    replicas = serve_app.wait_for_replicas(2, exclude={victim.split("@")[0]})
    assert victim.split("@")[0] not in {r["id"] for r in replicas}
    answered_by = set()
    for index in range(CLIENTS, CLIENTS + 24):
        answered_by.add(Conversation(client, model, index).ask(max_tokens=2)["replica"])
        if len(answered_by) == 2:
            break
    assert len(answered_by) == 2 and victim not in answered_by, answered_by


def test_the_ui_answers_through_the_ingress_and_control_reaches_each_replica(serve_app, tmp_path):
    from gradio_client import Client, handle_file

    serve_app.wait_for_replicas(2)  # a replica killed by this module's other test may still be restarting
    film = tmp_path / "film.png"
    film.write_bytes(png_bytes(quantize(chest_phantom(seed=9), 8)))
    ui = Client(serve_app.url, verbose=False)
    ui.predict(handle_file(str(film)), api_name="/upload_film")
    chat, _question = ui.predict("What are the main findings?", api_name="/ask")
    assert chat[-1]["role"] == "assistant" and answer_text(chat).strip()

    result = subprocess.run(
        [sys.executable, "-m", "medgemma_xray.scaleout.control", "status"],
        cwd=REPO_ROOT,
        env=serve_app.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    statuses = json.loads(result.stdout)
    assert len(statuses) == 2 and all(s["ready"] and s["mode"] == "pytorch" for s in statuses.values())
    assert {s["replica"].split("@")[0] for s in statuses.values()} == set(statuses)
    # Each replica keeps its heap as the single server does (serving/memory.keep_heap_small): a trim thread runs.
    assert all(s["heap"]["trim_every_s"] == 60 for s in statuses.values()), statuses
