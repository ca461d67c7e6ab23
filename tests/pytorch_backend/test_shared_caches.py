"""Shared caches on the demo checkpoint (CPU, fp32): several prompts prefilled in one packed forward give their
one-at-a-time tokens; the image cache and the prefix cache hit on the same film and miss on another; two films
with the same question never share KV; a small cache evicts and still answers the same."""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.inference_api.shared_caches import PrefixBlockCache
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
from tests.pytorch_backend.conftest import QUESTIONS, run


@pytest.fixture(scope="module")
def lone(demo_model_dir):
    """The reference: no shared caches at all, every prompt prefilled alone."""
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    backend = FastTorchInference(
        demo_model_dir, device="cpu", slots=4, max_sequence=1024, prefix_cache_gib=0, image_cache_gib=0
    )
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def shared(demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    backend = FastTorchInference(demo_model_dir, device="cpu", slots=4, max_sequence=1024, prefix_cache_gib=0.05)
    yield backend
    backend.close()


def ask(film, question: str, tokens: int = 10) -> GenerationRequest:
    return GenerationRequest(film, (ChatTurn("user", question),), max_new_tokens=tokens)


def test_prompts_prefilled_together_give_their_one_at_a_time_tokens(lone, films):
    requests = [
        ask(film, question, tokens=8 + 4 * i) for i, (film, question) in enumerate(zip(films, QUESTIONS, strict=True))
    ]
    expected = [run(lone, request) for request in requests]
    generations = [lone.start(request) for request in requests]
    try:
        lone.prepare_images(generations)
        assert lone.prefill_batch(generations) == [True, True, True]  # one packed forward for all three
        while not all(g.done for g in generations):
            lone.step(generations)
    finally:
        for generation in generations:
            lone.finish(generation)
    for generation, reference in zip(generations, expected, strict=True):
        assert generation.stats.token_ids == reference.token_ids
        assert np.allclose(generation.stats.token_logprobs, reference.token_logprobs, atol=1e-4)


def test_a_token_budget_splits_the_packed_prefill_into_chunks_with_the_same_tokens(lone, films):
    requests = [ask(films[0], QUESTIONS[0]), ask(films[1], QUESTIONS[1])]
    expected = [run(lone, request).token_ids for request in requests]
    generations = [lone.start(request) for request in requests]
    try:
        turns = 0
        while not all(g.prefill_done for g in generations):
            lone.prefill_batch(generations, budget_tokens=200)  # first come first served, 200 tokens a turn
            turns += 1
        assert turns >= 3  # two prompts of 280+ tokens each cannot fit two 200-token turns
        while not all(g.done for g in generations):
            lone.step(generations)
    finally:
        for generation in generations:
            lone.finish(generation)
    assert [g.stats.token_ids for g in generations] == expected


def test_image_and_prefix_caches_hit_on_the_same_film_and_miss_on_another(shared, lone, films):
    before = shared.cache_stats()
    first = run(shared, ask(films[0], QUESTIONS[0]))
    second = run(shared, ask(films[0], QUESTIONS[1]))  # same film, another question
    after_same = shared.cache_stats()
    assert after_same["mm_cache"]["encoder_calls"] - before["mm_cache"]["encoder_calls"] == 1  # the film once
    assert first.prefix_cached_tokens == 0 and second.prefix_cached_tokens > 256  # the film's tokens were shared
    other = run(shared, ask(films[1], QUESTIONS[1]))  # another film
    after_other = shared.cache_stats()
    assert other.prefix_cached_tokens == 0
    assert after_other["mm_cache"]["encoder_calls"] - after_same["mm_cache"]["encoder_calls"] == 1
    for stats, request in ((second, ask(films[0], QUESTIONS[1])), (other, ask(films[1], QUESTIONS[1]))):
        assert stats.token_ids == run(lone, request).token_ids


def test_the_image_cache_serves_a_film_whose_prefix_was_not_cached(shared, lone, films, demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    images_only = FastTorchInference(demo_model_dir, device="cpu", slots=2, max_sequence=1024, prefix_cache_gib=0)
    try:
        features = images_only.image_features([films[2]])  # a batch job's features phase fills the cache too
        assert np.allclose(features, lone.image_features([films[2]]), atol=1e-5)
        run(images_only, ask(films[2], QUESTIONS[0]))
        stats = run(images_only, ask(films[2], QUESTIONS[2]))
        figures = images_only.cache_stats()["mm_cache"]
        assert (figures["encoder_calls"], figures["hits"]) == (1, 2)
        assert stats.token_ids == run(lone, ask(films[2], QUESTIONS[2])).token_ids
    finally:
        images_only.close()


def test_two_films_with_the_same_question_never_share_kv(shared, lone, films):
    question = "Describe this film."
    a = run(shared, ask(films[0], question, tokens=12))
    b = run(shared, ask(films[2], question, tokens=12))
    assert b.prefix_cached_tokens == 0  # identical text, identical image-token ids: the film's hash keeps them apart
    assert a.token_ids == run(lone, ask(films[0], question, tokens=12)).token_ids
    assert b.token_ids == run(lone, ask(films[2], question, tokens=12)).token_ids
    # The demo model reads the film (these phantoms show no finding, so the words may agree, their probabilities
    # do not): shared KV would have made them one answer.
    assert (a.token_ids, a.token_logprobs) != (b.token_ids, b.token_logprobs)


def test_conversations_on_one_film_read_one_set_of_pages_and_other_films_none_of_them(shared, lone, films):
    """Paged KV: the film's prompt pages are held by reference (no copy) by every conversation on that film, while
    they run at the same time; a conversation on another film holds none of them; answers stay the lone ones."""
    question = "Is the heart enlarged?"
    run(shared, ask(films[1], question))  # fills the prefix cache with film 1's prompt pages
    copies = []
    original_copy = shared.decoder.copy_page
    shared.decoder.copy_page = lambda source, target: copies.append((source, target))
    requests = [
        ask(films[1], question),
        ask(films[1], "Any pleural effusion on the left side?"),
        ask(films[0], question),
    ]
    generations = [shared.start(request) for request in requests]
    try:
        shared.prepare_images(generations)
        assert shared.prefill_batch(generations) == [True, True, True]
        same, other, elsewhere = (g.conversation.kv.pages for g in generations)
        # Pages the two conversations on film 1 both take from the cache (the film and the text they share).
        cached = min(g.stats.prefix_cached_tokens for g in generations[:2]) // 16
        assert cached >= 256 // 16  # at least the film's image tokens come from the cache
        assert same[:cached] == other[:cached]  # one set of pages for both conversations
        assert all(shared.pages.holders(page) >= 3 for page in same[:cached])  # the cache and both conversations
        assert not set(elsewhere) & (set(same) | set(other))  # another film: none of them
        assert same[cached:] != other[cached:] and not set(same[cached:]) & set(other[cached:])  # own pages after
        while not all(g.done for g in generations):
            shared.step(generations)
    finally:
        shared.decoder.copy_page = original_copy
        for generation in generations:
            shared.finish(generation)
    assert copies == []  # nothing was copied at admission
    for generation, request in zip(generations, requests, strict=True):
        assert generation.stats.token_ids == run(lone, request).token_ids


def test_a_colliding_chain_hash_still_never_crosses_films():
    cache = PrefixBlockCache(capacity_blocks=8, block_tokens=4)
    ids = [7] * 12
    assert [index for index, _ in cache.reserve("image:aaa", ids, 0)] == [0, 1, 2]
    assert len(cache.lookup("image:aaa", ids, 12)) == 3
    assert cache.lookup("image:bbb", ids, 12) == []  # same tokens, another film
    cache.chain = lambda root, ids: PrefixBlockCache.chain(cache, "image:aaa", ids)  # every root hashes alike
    assert cache.lookup("image:bbb", ids, 12) == []  # the stored root is compared, not only the hash


def test_a_small_cache_evicts_and_still_answers_the_same(lone, films, demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    probe = lone.decoder.page_bytes()
    blocks = 24  # fewer than two prompts' worth (each prompt is 280+ tokens: 17+ blocks)
    film_bytes = lone.model.config.mm_tokens_per_image * lone.text_config.hidden_size * 4
    small = FastTorchInference(
        demo_model_dir,
        device="cpu",
        slots=2,
        max_sequence=1024,
        prefix_cache_gib=blocks * probe / 2**30,
        image_cache_gib=1.5 * film_bytes / 2**30,  # room for one film's features
    )
    try:
        assert small.prefix_cache.capacity_blocks == blocks
        for film, question in zip(films, QUESTIONS, strict=True):
            stats = run(small, ask(film, question))
            assert stats.token_ids == run(lone, ask(film, question)).token_ids
        figures = small.cache_stats()
        assert figures["prefix_cache"]["evictions"] > 0 and figures["prefix_cache"]["blocks_used"] <= blocks
        assert figures["mm_cache"]["evictions"] == 2 and figures["mm_cache"]["entries"] == 1
        again = run(small, ask(films[0], QUESTIONS[0]))  # its blocks and features were evicted
        assert again.prefix_cached_tokens == 0
        assert small.cache_stats()["mm_cache"]["encoder_calls"] == 4
        assert again.token_ids == run(lone, ask(films[0], QUESTIONS[0])).token_ids
    finally:
        small.close()
