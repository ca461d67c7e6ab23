"""Two films in one prompt (a prior, then the current film, then the question: the order of Google-Health/medgemma's
cxr_longitudinal_comparison notebook) through every PyTorch path on the demo model, on CPU: transformers' own
generate(), the eager reference, the fast path (packed and bucketed prefill, paged KV, shared caches) and the batch
scheduler with other answers in the batch.

The demo model has not learnt to compare films, so its greedy words may not change with the prior; the next-token
logits must (the prior's features reach the model), and each path's logits must equal the eager reference's."""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.inference_api.chat import chat_messages
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
from medgemma_xray.pytorch_backend.hf_reference import hf_generate
from tests.pytorch_backend.conftest import run

CHANGED = "What changed since the prior film?"


@pytest.fixture(scope="module")
def eager(demo_model_dir):
    from medgemma_xray.pytorch_backend.eager import TorchInference

    backend = TorchInference(demo_model_dir, device="cpu")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def fast(demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    # prefill_buckets: a fresh prompt of up to 1024 tokens takes the padded whole-prompt prefill (a CUDA graph on
    # the GPU); a follow-up, a cached prefix and next_token_logits take the packed one. Both place the films' rows.
    backend = FastTorchInference(
        demo_model_dir, device="cpu", slots=4, max_sequence=1536, max_resident_conversations=2, prefill_buckets=(1024,)
    )
    yield backend
    backend.close()


def compare(films, question: str = CHANGED, **extra) -> GenerationRequest:
    prior, current = films[0], films[1]
    return GenerationRequest(current, (ChatTurn("user", question),), max_new_tokens=8, prior_image=prior, **extra)


def test_the_user_turn_holds_the_prior_then_the_current_film_then_the_text(films):
    request = compare(films)
    content = chat_messages(request)[1]["content"]
    assert [part["type"] for part in content] == ["image", "image", "text"]
    assert content[0]["image"] is films[0] and content[1]["image"] is films[1] and content[2]["text"] == CHANGED
    one = chat_messages(GenerationRequest(films[1], request.turns))[1]["content"]
    assert [part["type"] for part in one] == ["image", "text"]


def test_a_prior_puts_two_films_of_image_tokens_in_the_prompt_and_every_path_gives_generate_s_tokens(
    eager, fast, films
):
    request = compare(films)
    alone = GenerationRequest(films[1], request.turns, max_new_tokens=8)
    per_film = eager.image_tokens_per_film
    for backend in (eager, fast):
        ids = backend._encode_impl(request).ids
        assert ids.count(backend.image_token_id) == 2 * per_film == 512
        assert len(ids) - backend.prompt_length(alone) == per_film + 6  # a film: <boi>, 256 tokens, <eoi>, breaks
    expected = hf_generate(eager, request)[0]
    produced = {name: run(backend, request) for name, backend in (("eager", eager), ("fast", fast))}
    assert len(expected) >= 3
    assert produced["eager"].token_ids == expected
    assert produced["fast"].token_ids == expected
    assert produced["fast"].prompt_tokens == produced["eager"].prompt_tokens == len(eager._encode_impl(request).ids)


def test_the_prior_reaches_the_model_and_the_fast_path_places_each_films_rows_as_eager(eager, fast, films):
    with_prior = compare(films)
    other_prior = compare([films[2], films[1]])
    swapped = compare([films[1], films[0]])
    logits = {}
    for name, request in (("prior", with_prior), ("other", other_prior), ("swapped", swapped)):
        reference = eager.next_token_logits(request)
        assert np.allclose(fast.next_token_logits(request), reference, atol=1e-3), name
        logits[name] = reference
    import torch

    from medgemma_xray.pytorch_backend.hf_reference import hf_inputs

    inputs = hf_inputs(eager, with_prior).to(eager.device, dtype=eager.dtype)  # the processor's own tensors
    assert inputs["pixel_values"].shape[0] == 2
    with torch.inference_mode():
        processor_logits = eager.model(**inputs).logits[0, -1].float().numpy()
    assert np.allclose(logits["prior"], processor_logits, atol=1e-3)
    assert np.abs(logits["prior"] - logits["other"]).max() > 1e-3, "another prior gives the same logits"
    assert np.abs(logits["prior"] - logits["swapped"]).max() > 1e-3, "the films' order does not matter"


def test_each_film_is_encoded_once_and_another_prior_shares_neither_conversation_nor_prefix(eager, fast, films):
    fast.forget_all()
    fast.prefix_cache.clear()
    fast.image_cache.clear()
    calls = fast.image_cache.encoder_calls
    first = run(fast, compare(films))
    assert fast.image_cache.encoder_calls - calls == 2  # the prior and the current film, each once
    again = run(fast, compare(films))
    assert fast.image_cache.encoder_calls - calls == 2  # both from the image cache
    assert again.prefix_cached_tokens > 2 * 256 and again.token_ids == first.token_ids
    other = compare([films[2], films[1]])
    produced = run(fast, other)
    assert fast.image_cache.encoder_calls - calls == 3  # only the new prior went through the vision tower
    first_image = fast._encode_impl(other).ids.index(fast.image_token_id)
    assert produced.prefix_cached_tokens <= first_image, "a prefix of another prior's prompt was reused"
    assert produced.token_ids == run(eager, other).token_ids
    current_only = GenerationRequest(films[1], other.turns, max_new_tokens=8)
    alone = run(fast, current_only)
    assert alone.prefix_cached_tokens <= first_image  # the current film alone is another prompt again
    assert alone.token_ids == run(eager, current_only).token_ids


def test_a_follow_up_keeps_both_films_and_continues_the_resident_conversation(eager, fast, films):
    first = compare(films, conversation_id="pair")
    answer = fast.generate(first)
    turns = (*first.turns, ChatTurn("assistant", answer), ChatTurn("user", "Is the effusion larger?"))
    follow_up = GenerationRequest(films[1], turns, max_new_tokens=8, prior_image=films[0], conversation_id="pair")
    produced = run(fast, follow_up)
    assert produced.reused_tokens > 2 * 256, "the follow-up prefilled both films again"
    fresh = GenerationRequest(films[1], turns, max_new_tokens=8, prior_image=films[0])
    assert eager._encode_impl(fresh).ids.count(eager.image_token_id) == 512
    assert produced.token_ids == run(eager, fresh).token_ids
    without_prior = GenerationRequest(films[1], turns, max_new_tokens=8, conversation_id="pair")
    assert run(fast, without_prior).reused_tokens == 0, "a turn without the prior reused the pair's KV"


def test_the_scheduler_batches_a_comparison_with_other_answers_and_gives_its_tokens_alone(eager, fast, films):
    from medgemma_xray.serving.scheduler import Scheduler

    requests = [
        compare(films),
        GenerationRequest(films[0], (ChatTurn("user", "Findings?"),), max_new_tokens=8),
        compare([films[2], films[0]], "Has anything new appeared?"),
        GenerationRequest(films[2], (ChatTurn("user", "Is the heart enlarged?"),), max_new_tokens=8),
    ]
    alone = [run(eager, request) for request in requests]
    fast.forget_all()
    fast.prefix_cache.clear()
    fast.image_cache.clear()
    scheduler = Scheduler(fast, max_active=4, max_waiting=8, name="prior-films")
    try:
        stats = [GenerationStats() for _ in requests]
        tickets = [scheduler.submit(request, stat) for request, stat in zip(requests, stats, strict=True)]
        texts = ["".join(ticket.deltas(300, 300)) for ticket in tickets]
    finally:
        assert scheduler.close(60)
    assert all(texts)
    assert [stat.token_ids for stat in stats] == [stat.token_ids for stat in alone]
    for produced, expected in zip(stats, alone, strict=True):  # and the features behind them: the same films
        assert np.allclose(produced.token_logprobs, expected.token_logprobs, atol=1e-3)
    assert stats[0].prompt_tokens == len(eager._encode_impl(requests[0]).ids)
