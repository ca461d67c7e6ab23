"""The API's film reading, on the server's one film intake: ten requests at once that carry one film decode it
once (the API's extra TTFT on the H200 was the per-request decode), a resent film is not decoded again, a film the
intake's cache let go is read again, and a bad film is refused every time with a 400 and the intake's code.
End to end: ten requests to a real server (in this process, over HTTP) carrying one film decode it once."""

from __future__ import annotations

import asyncio
import base64
import threading
import time

import pytest

from medgemma_xray.intake import FilmIntake, IntakeConfig
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.web.openai.errors import ApiError
from medgemma_xray.web.openai.films import FilmReader


def data_url(content: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(content).decode()


def phantom_url(seed: int, size: int = 256) -> str:
    return data_url(png_bytes(quantize(chest_phantom(rows=size, cols=size, seed=seed), 8)))


def test_ten_reads_at_once_of_one_film_decode_it_once_and_a_resent_film_is_not_decoded_again():
    intake = FilmIntake(IntakeConfig())
    films = FilmReader(intake)
    one, others = phantom_url(5), [phantom_url(seed) for seed in (6, 7)]

    async def scenario():
        reads = [films.read(one) for _ in range(10)] + [films.read(url) for url in others]
        first = await asyncio.gather(*reads)
        again = await films.read(one)
        return first, again

    first, again = asyncio.run(scenario())
    assert intake.decodes == 3, "one decode for the ten requests with one film, one for each other film"
    assert len({id(film.model_image) for film in first[:10]}) == 1 and again is first[0]
    assert intake.peak_decodes <= intake.config.max_decodes


def test_a_film_the_intake_let_go_is_read_again_and_a_bad_film_is_refused_every_time():
    one_film = FilmIntake(IntakeConfig()).read(base64.b64decode(phantom_url(1).split(",")[1])).nbytes
    intake = FilmIntake(IntakeConfig(cache_bytes=one_film + 1))  # room for one film
    films = FilmReader(intake)
    first, second = phantom_url(1), phantom_url(2)

    async def scenario():
        refusals = []
        for _ in range(2):
            with pytest.raises(ApiError) as refused:
                await films.read(data_url(b"\x89PNG\r\n\x1a\n" + b"\0" * 64))
            refusals.append(refused.value)
        kept = await films.read(first)
        await films.read(second)  # pushes the first film out of the intake's cache
        return refusals, kept, await films.read(first)

    refusals, kept, reread = asyncio.run(scenario())
    assert all(error.status == 400 and error.code == "not_an_image" and "PNG" in error.message for error in refusals)
    assert reread.key == kept.key and reread is not kept, "read again from its bytes, not from a stale memo"
    assert intake.decodes == 5


def test_the_api_decodes_a_film_once_for_ten_requests_that_carry_it(random_model_dir, tmp_path):
    import openai
    import uvicorn
    from fastapi import FastAPI

    from medgemma_xray.serving.service import InferenceService
    from medgemma_xray.serving.settings import Settings
    from medgemma_xray.web.openai import add_openai_routes
    from tests.conftest import free_port

    settings = Settings(model_path=random_model_dir, generation_concurrency=4, max_new_tokens=4)
    service = InferenceService(settings)
    service.start()
    api = FastAPI()
    add_openai_routes(api, service)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn")
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped before it started"
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        film = phantom_url(21, size=1024)
        question = [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": film}}, {"type": "text", "text": "?"}],
            }
        ]
        intake = FilmIntake.for_settings(settings)
        before = intake.decodes
        answers: list = []

        def ask() -> None:
            answers.append(client.chat.completions.create(model=model, messages=question, max_tokens=4))

        askers = [threading.Thread(target=ask) for _ in range(10)]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(300)
        assert len(answers) == 10 and all(answer.usage.completion_tokens == 4 for answer in answers)
        assert intake.decodes - before == 1, f"{intake.decodes - before} decodes for one film sent ten times"
    finally:
        server.should_exit = True
        thread.join(30)
        service.close()
