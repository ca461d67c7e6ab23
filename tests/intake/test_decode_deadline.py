"""Every film decode runs in a worker process under a deadline: a decode that runs past it is killed and refused
with a message that says so, a worker that dies mid-decode is a refusal too, and the next film gets a fresh worker.
End to end: a server whose deadline a film exceeds answers the API client 400 with that message.

The slow decode is a real film far larger than the deadline allows (a 6000 x 6000 16-bit PNG against a deadline of
a few hundredths of a second): a loaded machine only makes it slower, so the outcome never depends on speed."""

from __future__ import annotations

import base64
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from medgemma_xray.intake import FilmIntake, IntakeConfig, NotAnImage
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize

TIGHT_S = 0.02


@pytest.fixture(scope="module")
def large_film() -> bytes:
    """36 Mpx of 16 bits: inflating, stretching and resizing it takes far longer than TIGHT_S anywhere."""
    pixels = np.zeros((6000, 6000), np.uint16)
    pixels[1000:5000, 1000:5000] = 40_000
    return png_bytes(pixels)


def small_film(seed: int = 3) -> bytes:
    return png_bytes(quantize(chest_phantom(256, 224, seed=seed), 8))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def exited(pid: int) -> bool:
    """The process has ended (a zombie until the pool reaps it, or gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_decode_past_the_deadline_is_killed_and_refused_and_the_next_film_gets_a_fresh_worker(large_film):
    intake = FilmIntake(IntakeConfig(film_check="off", decode_timeout_s=TIGHT_S, max_decodes=1))
    try:
        with pytest.raises(NotAnImage, match=f"took longer than {TIGHT_S:g} s, so it was stopped.*PNG"):
            intake.read(large_film)
        pool = intake.decode_pool
        assert pool is not None and pool.killed == 1 and pool.idle_pids == [], "the worker that ran over was killed"
        assert intake.cache_bytes == 0, "a refusal is not kept"
        relaxed = FilmIntake(IntakeConfig(film_check="off", decode_timeout_s=600, max_decodes=1))
        assert relaxed.read(small_film()).full_shape == (256, 224)
        (worker,) = relaxed.decode_pool.idle_pids
        assert alive(worker)
        relaxed.close()
        assert not alive(worker), "close() ends the workers"
    finally:
        intake.close()


def test_a_worker_that_dies_mid_decode_is_a_refusal_not_an_internal_error(large_film):
    intake = FilmIntake(IntakeConfig(film_check="off", decode_timeout_s=600, max_decodes=1))
    try:
        intake.read(small_film())  # starts the one worker
        (worker,) = intake.decode_pool.idle_pids
        outcome: dict[str, BaseException] = {}

        def read() -> None:
            try:
                intake.read(large_film)
            except BaseException as exc:
                outcome["error"] = exc

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 60
        while intake.decoding == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(worker, 9)  # as the kernel's OOM killer would
        reader.join(120)
        assert isinstance(outcome.get("error"), NotAnImage), outcome
        assert "decoder stopped while reading this file" in str(outcome["error"])
        assert intake.read(small_film(seed=4)).full_shape == (256, 224), "a fresh worker reads the next film"
    finally:
        intake.close()


def test_the_api_client_is_told_the_film_took_too_long(tmp_path, large_film, demo_model_dir):
    import openai

    from tests.conftest import start_server

    server = start_server(tmp_path / "logs", env={"FILM_DECODE_TIMEOUT_S": str(TIGHT_S), "FILM_CHECK": "off"})
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        url = "data:image/png;base64," + base64.b64encode(large_film).decode()
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=client.models.list().data[0].id,
                max_tokens=4,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Findings?"},
                            {"type": "image_url", "image_url": {"url": url}},
                        ],
                    }
                ],
            )
        assert "took longer than" in str(refused.value) and "so it was stopped" in str(refused.value)
        assert "Traceback" not in server.log_text
        assert "its worker was killed" in server.log_text
    finally:
        server.stop()


def test_a_worker_that_died_while_idle_costs_the_next_film_nothing():
    intake = FilmIntake(IntakeConfig(film_check="off", decode_timeout_s=600, max_decodes=1))
    try:
        intake.read(small_film())
        (worker,) = intake.decode_pool.idle_pids
        os.kill(worker, 9)
        deadline = time.monotonic() + 60
        while not exited(worker) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert intake.read(small_film(seed=5)).full_shape == (256, 224)
        assert intake.decode_pool.idle_pids != [worker]
    finally:
        intake.close()
