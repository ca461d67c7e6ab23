"""The first-token paths on CPU, against the fast path without them (demo checkpoint, fp32): a new conversation's
prompt padded to a prefill bucket, and the film's pixels preprocessed before the question reaches the loop. On the
GPU the bucket replays a captured graph; here the same padded function runs eagerly, so the tokens must be the
plain path's tokens. (Steps queued ahead of the host: tests/serving/test_scheduler_overlap.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.pytorch_backend.pixel_cache import PixelCache
from medgemma_xray.pytorch_backend.prefill_graphs import image_rows, prefill_bucket, usable_buckets
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image
from tests.pytorch_backend.conftest import QUESTIONS, run


@pytest.fixture(scope="module")
def plain(demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    backend = FastTorchInference(demo_model_dir, device="cpu", slots=4, max_sequence=1024, max_resident_conversations=2)
    backend.warm_up()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def quick(plain):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    backend = FastTorchInference(
        "demo",
        preloaded=(plain.model, plain.processor),
        slots=4,
        max_sequence=1024,
        max_resident_conversations=2,
        prefill_buckets=(64, 512, 1024),
    )
    backend.warm_up()
    return backend


def test_a_prompt_takes_the_smallest_bucket_that_holds_it():
    buckets = (512, 64, 128)
    assert prefill_bucket(2, buckets) == 64
    assert prefill_bucket(64, buckets) == 64
    assert prefill_bucket(65, buckets) == 128
    assert prefill_bucket(400, buckets) == 512
    assert prefill_bucket(513, buckets) is None  # the packed path takes it
    assert prefill_bucket(1, buckets) is None  # one token gains nothing from a graph
    assert usable_buckets((64, 2048, 512, 64), max_sequence=1024) == (64, 512)  # padding must fit the slot


def test_image_rows_and_blocks_come_from_the_host_ids():
    rows, blocks = image_rows([1, 9, 9, 2, 9, 3], image_token_id=9)
    assert rows == [1, 2, 4]
    assert blocks == [-1, 0, 0, -1, 1, -1]
    assert image_rows([1, 2], image_token_id=None) == ([], [-1, -1])


def test_the_pixel_cache_keeps_the_most_recent_films():
    cache = PixelCache(capacity=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.get(None) is None and cache.misses == 1
    with pytest.raises(ValueError, match="0 or more"):
        PixelCache(capacity=-1)


def test_bucketed_prefill_gives_the_plain_paths_tokens(plain, quick, films):
    prefilled = []
    original = quick.decoder.prefill_static

    def counting(*args):
        prefilled.append(args[0].shape[0])
        return original(*args)

    quick.decoder.prefill_static = counting
    try:
        for film, question in zip(films, QUESTIONS, strict=True):
            request = GenerationRequest(film, (ChatTurn("user", question),), max_new_tokens=16)
            reference, produced = run(plain, request), run(quick, request)
            assert produced.token_ids == reference.token_ids
            assert np.allclose(produced.token_logprobs, reference.token_logprobs, atol=1e-4)
    finally:
        quick.decoder.prefill_static = original
    assert prefilled and set(prefilled) <= {512}  # each prompt (~290 tokens) padded to its bucket


def test_batches_that_change_and_rows_that_are_reused_keep_the_plain_tokens(plain, quick, films):
    def batched(backend):
        requests = [
            GenerationRequest(film, (ChatTurn("user", question),), max_new_tokens=6 + 5 * index, conversation_id=q)
            for index, (film, question, q) in enumerate(zip(films, QUESTIONS, "xyz", strict=True))
        ]
        generations = [backend.start(request) for request in requests]
        backend.run_together(generations)  # rows leave the batch as they finish
        for generation in generations:
            backend.finish(generation)
        follow = GenerationRequest(
            films[0],
            (ChatTurn("user", "Findings?"), ChatTurn("assistant", "x"), ChatTurn("user", "Heart?")),
            max_new_tokens=5,
        )
        out = [g.stats.token_ids for g in generations] + [run(backend, follow).token_ids]  # slots evicted, reused
        for name in "xyz":
            backend.forget(name)
        return out

    assert batched(quick) == batched(plain)
    assert sorted(quick._free_rows) == [0, 1, 2, 3]
    assert quick.pages.used == quick.prefix_cache.used_blocks  # only the prefix cache still holds pages


def test_a_film_preprocessed_on_arrival_is_not_preprocessed_again(quick, films):
    from medgemma_xray.serving.scheduler import Scheduler

    film = model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=77), 8))))
    request = GenerationRequest(film, (ChatTurn("user", "Findings?"),), max_new_tokens=4)
    reference = run(quick, request).token_ids  # also fills the image cache: use a new film below
    calls = []
    original = quick.pixel_values
    quick.pixel_values = lambda images: calls.append(len(images)) or original(images)
    scheduler = Scheduler(quick, max_active=2, max_waiting=4)
    try:
        fresh = model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=78), 8))))
        stats = GenerationStats()
        ticket = scheduler.submit(GenerationRequest(fresh, request.turns, max_new_tokens=4), stats)
        assert calls == [1]  # on the submitting thread, before the loop admitted it
        "".join(ticket.deltas(60, 60))
        assert calls == [1] and quick.pixel_cache.hits >= 1  # the loop's vision call found the pixels
        assert 1 <= len(stats.token_ids) <= 4 and stats.finish_reason is not None
    finally:
        scheduler.close(timeout_s=30)
        quick.pixel_values = original
    assert reference


def test_films_preprocessed_on_arrival_are_not_preprocessed_again_in_a_vision_batch(quick, films):
    """A class arriving at once: the loop's vision batch takes every film's pixels from the pixel cache (they were
    made on the submitting threads), not from the processor on the loop's thread; the features are the same."""
    fresh = [model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in (90, 91)]
    requests = [GenerationRequest(film, (ChatTurn("user", "Findings?"),), max_new_tokens=3) for film in fresh]
    generations = [quick.start(request) for request in requests]
    for generation, film in zip(generations, fresh, strict=True):
        quick.preprocess_film(film, generation.prompt.image_key)
    calls = []
    original = quick.pixel_values
    quick.pixel_values = lambda images: calls.append(len(images)) or original(images)
    try:
        quick.prepare_images(generations)  # one vision batch of both films
    finally:
        quick.pixel_values = original
        for generation in generations:
            quick.finish(generation, cancelled=True)
    assert calls == []
    expected = quick.image_features(fresh)
    produced = [generation.prompt.features.float().numpy() for generation in generations]
    assert np.allclose(np.stack(produced), expected, atol=1e-5)
