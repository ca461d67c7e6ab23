"""The API's film decoding: a film resent with a follow-up is decoded once (the API's extra TTFT on the H200 was the
per-request decode), the cache stays within its byte bound, and a bad film is refused every time, never cached."""

from __future__ import annotations

import pytest

from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.serving.settings import Settings
from medgemma_xray.web.openai_api import ApiError, DecodedFilms, film_loader


def test_a_resent_film_is_decoded_once_and_bad_bytes_are_refused_each_time():
    load = film_loader(Settings())
    data = png_bytes(quantize(chest_phantom(seed=3), 8))
    first, again = load(data), load(data)
    assert again[0] is first[0] and again[2] == first[2]
    other = load(png_bytes(quantize(chest_phantom(seed=4), 8)))
    assert other[2] != first[2]
    for _ in range(2):
        with pytest.raises(ApiError, match="PNG"):
            load(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)


def test_the_cache_keeps_within_its_bytes():
    settings = Settings()
    films = [png_bytes(quantize(chest_phantom(rows=128, cols=128, seed=seed), 8)) for seed in range(4)]
    one_film = 128 * 128 * 3
    cache = DecodedFilms(max_bytes=2 * one_film)
    load = film_loader(settings, cache)
    images = [load(data)[0] for data in films]
    assert load(films[3])[0] is images[3] and load(films[2])[0] is images[2]
    assert load(films[0])[0] is not images[0], "the oldest film was evicted"
