"""The API's film reading: a film resent with a follow-up is decoded once (the API's extra TTFT on the H200 was the
per-request decode), ten requests at once that carry one film decode it once, at most two films decode at a time,
the cache stays within its byte bound, and a bad film is refused every time, never cached."""

from __future__ import annotations

import asyncio
import base64
import threading

import pytest

from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.serving.settings import Settings
from medgemma_xray.web.openai.errors import ApiError
from medgemma_xray.web.openai.films import DecodedFilms, FilmReader, film_loader


def data_url(content: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(content).decode()


def reader(**kwargs) -> FilmReader:
    settings = Settings()
    return FilmReader(film_loader(settings), settings.max_file_size_bytes, **kwargs)


def test_a_resent_film_is_decoded_once_and_bad_bytes_are_refused_each_time():
    films = reader()
    url = data_url(png_bytes(quantize(chest_phantom(seed=3), 8)))

    async def scenario():
        first, again = await films.read(url), await films.read(url)
        other = await films.read(data_url(png_bytes(quantize(chest_phantom(seed=4), 8))))
        refusals = []
        for _ in range(2):
            with pytest.raises(ApiError) as refused:
                await films.read(data_url(b"\x89PNG\r\n\x1a\n" + b"\0" * 64))
            refusals.append(refused.value)
        return first, again, other, refusals

    first, again, other, refusals = asyncio.run(scenario())
    assert again.image is first.image and again.image_hash == first.image_hash
    assert other.image_hash != first.image_hash
    assert films.decodes == 4, "two films decoded once each, the bad one each time it came"
    assert all(error.status == 400 and error.code == "invalid_image" and "PNG" in error.message for error in refusals)


def test_ten_requests_at_once_with_one_film_decode_it_once_and_decodes_are_bounded():
    entered, release = threading.Semaphore(0), threading.Event()
    running, most = [0], [0]
    lock = threading.Lock()
    load = film_loader(Settings())

    def held_load(data: bytes):  # the real loader, held until every request has arrived
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        entered.release()
        release.wait(60)
        try:
            return load(data)
        finally:
            with lock:
                running[0] -= 1

    films = FilmReader(held_load, Settings().max_file_size_bytes, decodes_at_once=2)
    one = data_url(png_bytes(quantize(chest_phantom(rows=256, cols=256, seed=5), 8)))
    others = [data_url(png_bytes(quantize(chest_phantom(rows=256, cols=256, seed=seed), 8))) for seed in (6, 7, 8)]

    async def scenario():
        reads = [asyncio.ensure_future(films.read(one)) for _ in range(10)]
        reads += [asyncio.ensure_future(films.read(url)) for url in others]
        for _ in range(2):  # two decodes enter ...
            assert await asyncio.to_thread(entered.acquire, True, 60)
        while films.waiting_decodes < 2:  # ... and the other two films wait their turn
            await asyncio.sleep(0.01)
        assert running[0] == 2
        release.set()
        return await asyncio.gather(*reads)

    results = asyncio.run(scenario())
    assert films.decodes == 4, "one decode for the ten requests with one film, one for each other film"
    assert len({id(film.image) for film in results[:10]}) == 1
    assert most[0] <= 2, f"{most[0]} films decoded at once"


def test_the_cache_keeps_within_its_bytes():
    urls = [data_url(png_bytes(quantize(chest_phantom(rows=128, cols=128, seed=seed), 8))) for seed in range(4)]
    one_film = 128 * 128 * 3
    films = reader(cache=DecodedFilms(max_bytes=2 * one_film))

    async def scenario():
        images = [(await films.read(url)).image for url in urls]
        assert (await films.read(urls[3])).image is images[3] and (await films.read(urls[2])).image is images[2]
        assert (await films.read(urls[0])).image is not images[0], "the oldest film was evicted"

    asyncio.run(scenario())
