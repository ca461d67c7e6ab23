"""The soak's users: real clients at each door, each answer recorded as ok, failed (with the message the client was
shown) or lost (no answer and no message: a dropped connection, a time-out, an empty answer).

- main page: gradio_client, New case, upload a DICOM, 1-3 questions, every third case a report;
- API: the openai client on /v1/chat/completions, the film as a PNG data: URL, streaming and not, alternately;
- /teaching: gradio_client, the student's own film, then a question.

A client that fails starts over with a fresh connection (a restarted server has none of its session), after a
pause, as a person pressing reload would.
"""

from __future__ import annotations

import base64
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ANSWER_TIMEOUT_S = 300.0  # longer than any answer took in the last soak (112 s): past it, the answer is lost
RETRYABLE_STATUS = (408, 429, 502, 503, 504)
# Words by which a person knows to try again; the server's busy, draining and restarting messages carry them.
RETRYABLE_WORDS = ("try again", "retry", "busy", "wait", "restart", "later", "in a moment", "full", "stopping")


@dataclass
class Answer:
    door: str  # main, main-report, api, api-stream, teaching
    client: int
    t0: float  # seconds since the soak started
    t1: float
    outcome: str  # ok | failed | refused | lost
    retryable: bool | None = None  # for failed: whether the message tells the user to try again
    message: str = ""

    def row(self) -> list:
        return [
            self.door,
            self.client,
            round(self.t0, 2),
            round(self.t1, 2),
            self.outcome,
            self.retryable,
            self.message,
        ]


class Recorder:
    """Where every client writes its answers; one lock for all."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.answers: list[Answer] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.started

    def add(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)


def is_retryable_text(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in RETRYABLE_WORDS)


def classify(exc: BaseException) -> tuple[str, bool | None, str]:
    """(outcome, retryable, message) for an exception a client raised."""
    import httpx
    import openai
    from gradio_client.exceptions import AppError

    message = f"{type(exc).__name__}: {exc}"
    root = _root_cause(exc)
    if root is not exc:  # openai's "Connection error." says nothing: the transport's own error says what happened
        message += f" (from {type(root).__name__}: {root})"
    message = message[:400]
    if isinstance(exc, AppError):  # the server said something: a gr.Error's text, shown as the page's toast
        return "failed", is_retryable_text(str(exc)), message
    if isinstance(exc, openai.APIStatusError):
        retryable = exc.status_code in RETRYABLE_STATUS
        return "failed", retryable, f"HTTP {exc.status_code}: {exc.message}"[:400]
    if isinstance(exc, openai.APITimeoutError | TimeoutError | httpx.TimeoutException):
        return "lost", None, message
    if isinstance(exc, openai.APIError) and not isinstance(exc, openai.APIConnectionError):
        return "failed", is_retryable_text(str(exc.message)), message  # an error event inside the stream
    cause = exc
    while cause is not None:
        if isinstance(cause, httpx.ConnectError | ConnectionRefusedError):
            return "refused", True, message  # never reached a server: nothing was lost, and trying again is safe
        cause = cause.__cause__ or cause.__context__
    return "lost", None, message


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while (exc.__cause__ or exc.__context__) is not None and id(exc.__cause__ or exc.__context__) not in seen:
        exc = exc.__cause__ or exc.__context__
        seen.add(id(exc))
    return exc


def _timed(recorder: Recorder, door: str, index: int, call) -> bool:
    """Run one answer, record it; True when it was answered."""
    t0 = recorder.now()
    try:
        call()
    except Exception as exc:  # every kind is recorded; the accounting judges them
        outcome, retryable, message = classify(exc)
        recorder.add(Answer(door, index, t0, recorder.now(), outcome, retryable, message))
        return False
    recorder.add(Answer(door, index, t0, recorder.now(), "ok"))
    return True


def _result(job):
    return job.result(timeout=ANSWER_TIMEOUT_S)


def _connect(url: str, deadline: float):
    """A gradio_client Client, retrying while the server restarts."""
    from gradio_client import Client

    while time.monotonic() < deadline:
        try:
            # gradio_client's own HTTP time-out is seconds: on a loaded host an upload outlasts it
            return Client(url, verbose=False, download_files=False, httpx_kwargs={"timeout": ANSWER_TIMEOUT_S})
        except Exception:  # the server is down or warming up: a person would reload a little later
            time.sleep(2.0)
    return None


def main_page_user(index: int, url: str, film: Path, deadline: float, recorder: Recorder, pause) -> None:
    from gradio_client import handle_file

    rng = random.Random(index)
    cycle = 0
    setup_t0 = 0.0
    while time.monotonic() < deadline:
        client = _connect(url, deadline)
        if client is None:
            return
        try:
            while time.monotonic() < deadline:
                cycle += 1
                setup_t0 = recorder.now()
                _result(client.submit(api_name="/new_case"))
                _result(client.submit(handle_file(str(film)), api_name="/upload_film"))
                for turn in range(rng.randint(1, 3)):
                    pause(rng.uniform(0.5, 4.0))

                    def ask(turn=turn, client=client):
                        chat = _result(client.submit(f"Client {index}, turn {turn}: findings?", api_name="/ask"))[0]
                        if not chat or chat[-1]["role"] != "assistant" or not chat[-1]["content"]:
                            raise AssertionError("no answer in the conversation")

                    if not _timed(recorder, "main", index, ask):
                        raise _StartOver
                if cycle % 3 == 0:

                    def report(client=client):
                        if not _result(client.submit(api_name="/report"))[0]:
                            raise AssertionError("empty report")

                    if not _timed(recorder, "main-report", index, report):
                        raise _StartOver
                pause(rng.uniform(1.0, 6.0))
        except _StartOver:
            pass
        except Exception as exc:  # New case or upload failed: not an answer, but counted and judged like one
            outcome, retryable, message = classify(exc)
            recorder.add(Answer("main-setup", index, setup_t0, recorder.now(), outcome, retryable, message))
        finally:
            client.close()
        pause(rng.uniform(2.0, 5.0))


def teaching_user(index: int, url: str, film: Path, deadline: float, recorder: Recorder, pause) -> None:
    from gradio_client import handle_file

    rng = random.Random(1000 + index)
    setup_t0 = 0.0
    while time.monotonic() < deadline:
        client = _connect(url, deadline)  # /teaching is a page of the same Gradio app: its events are the app's
        if client is None:
            return
        try:
            while time.monotonic() < deadline:
                setup_t0 = recorder.now()
                _result(client.submit(handle_file(str(film)), api_name="/teaching_upload_film"))
                pause(rng.uniform(0.5, 4.0))

                def ask(client=client):
                    chat = _result(client.submit("What is the main finding?", api_name="/teaching_ask"))[0]
                    if not chat or chat[-1]["role"] != "assistant" or not chat[-1]["content"]:
                        raise AssertionError("no answer in the conversation")

                if not _timed(recorder, "teaching", index, ask):
                    break
                pause(rng.uniform(2.0, 8.0))
        except Exception as exc:
            outcome, retryable, message = classify(exc)
            recorder.add(Answer("teaching-setup", index, setup_t0, recorder.now(), outcome, retryable, message))
        finally:
            client.close()
        pause(rng.uniform(2.0, 5.0))


def film_data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def api_user(index: int, url: str, film_url: str, deadline: float, recorder: Recorder, pause, max_tokens: int) -> None:
    import openai

    rng = random.Random(2000 + index)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="soak", max_retries=0, timeout=ANSWER_TIMEOUT_S)
    model = None
    turn = 0
    while time.monotonic() < deadline:
        turn += 1
        stream = turn % 2 == 0
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": film_url}},
                    {"type": "text", "text": f"API client {index}, question {turn}: is there an effusion?"},
                ],
            }
        ]

        def ask(stream=stream, messages=messages):
            nonlocal model
            if model is None:
                model = client.models.list().data[0].id
            if stream:
                text = "".join(
                    chunk.choices[0].delta.content or ""
                    for chunk in client.chat.completions.create(
                        model=model, messages=messages, max_tokens=max_tokens, stream=True
                    )
                    if chunk.choices
                )
            else:
                text = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
                text = text.choices[0].message.content
            if not text:
                raise AssertionError("empty answer")

        if not _timed(recorder, "api-stream" if stream else "api", index, ask):
            model = None
            pause(rng.uniform(2.0, 5.0))
        pause(rng.uniform(1.0, 6.0))
    client.close()


class _StartOver(Exception):
    """A failed answer: the user starts a new case on a fresh connection."""
