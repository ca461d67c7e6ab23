"""The fast path (static slotted KV cache, batched decode, chunked prefill) against the eager reference on CPU.

On CPU it runs without compile or CUDA graphs, in fp32, so equality with the eager path is exact: the same greedy
tokens, the same log-probabilities to float rounding."""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
from tests.pytorch_backend.conftest import QUESTIONS, run


@pytest.fixture(scope="module")
def eager(demo_model_dir):
    from medgemma_xray.pytorch_backend.eager import TorchInference

    backend = TorchInference(demo_model_dir, device="cpu")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def fast(demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    backend = FastTorchInference(demo_model_dir, device="cpu", slots=4, max_sequence=1024, max_resident_conversations=2)
    yield backend
    backend.close()


def test_same_greedy_tokens_and_logprobs_as_eager(eager, fast, films):
    for film, question in zip(films, QUESTIONS, strict=True):
        request = GenerationRequest(film, (ChatTurn("user", question),), max_new_tokens=24)
        reference, produced = run(eager, request), run(fast, request)
        assert produced.token_ids == reference.token_ids
        assert np.allclose(produced.token_logprobs, reference.token_logprobs, atol=1e-4)


def test_a_batched_step_gives_each_sequence_its_unbatched_tokens(eager, fast, films):
    requests = [
        GenerationRequest(film, (ChatTurn("user", question),), max_new_tokens=8 + 6 * index)
        for index, (film, question) in enumerate(zip(films, QUESTIONS, strict=True))
    ]
    generations = [fast.start(request) for request in requests]
    fast.run_together(generations)  # sequences of different lengths leave the batch as they finish
    for generation, request in zip(generations, requests, strict=True):
        fast.finish(generation)
        assert generation.stats.token_ids == run(eager, request).token_ids


def test_chunked_prefill_past_the_sliding_window_matches_eager(eager, fast, films):
    history = (
        ChatTurn("user", "Describe the lungs, pleura, heart, mediastinum, bones and every device you can see. " * 6),
        ChatTurn("assistant", "The lungs are clear. The heart size is normal. No pleural effusion. " * 8),
        ChatTurn("user", "Now compare both costophrenic angles and comment on the hemidiaphragms."),
    )
    request = GenerationRequest(films[0], history, max_new_tokens=16)
    chunk = fast.prefill_chunk_tokens
    fast.prefill_chunk_tokens = 100  # cuts land inside the image: the contract moves them out
    try:
        produced = run(fast, request)
    finally:
        fast.prefill_chunk_tokens = chunk
    reference = run(eager, request)
    assert reference.prompt_tokens > 512 + 50  # past the demo's 512-token window
    assert produced.token_ids == reference.token_ids


def test_follow_ups_reuse_slots_and_evicted_conversations_answer_the_same(eager, fast, films):
    answers = {}
    for name, film in zip("abc", films, strict=True):  # three conversations, two resident: "a" is evicted
        first = GenerationRequest(film, (ChatTurn("user", "Findings?"),), max_new_tokens=6, conversation_id=name)
        answers[name] = (first, fast.generate(first))
    assert fast.resident_conversations == ["b", "c"]
    for name in "bca":  # "a" last: its fresh prefill makes it resident and evicts the least recently used
        first, answer = answers[name]
        turns = (*first.turns, ChatTurn("assistant", answer), ChatTurn("user", "And the heart?"))
        follow_up = GenerationRequest(first.image, turns, max_new_tokens=6, conversation_id=name)
        stats = run(fast, follow_up)
        assert (stats.reused_tokens > 256) == (name != "a")
        assert stats.token_ids == run(eager, GenerationRequest(first.image, turns, max_new_tokens=6)).token_ids
    for name in "abc":
        fast.forget(name)
    assert sorted(fast._free_rows) == [0, 1, 2, 3]  # every row came back


def test_padding_rows_never_move_the_dummy_row_on(fast):
    """A captured batch pads with the dummy row; replaying it thousands of times must leave that row at a position
    its block table and rotary tables hold (it once moved one on per replay, past both)."""
    torch = fast._torch
    decoder = fast.decoder
    rows = torch.tensor([decoder.dummy_row] * 3)
    with torch.inference_mode():
        for _ in range(3):
            decoder.advance(decoder.decode, rows)
    assert int(decoder.row_positions[decoder.dummy_row]) == 0
