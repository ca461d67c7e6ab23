"""A follow-up continues from the ids its conversation generated, not from their re-tokenised text.

The previous answer's text can re-tokenise to other ids than the model generated (the 4B-shape random model on the
H200 did), so a follow-up encoded from text alone reused the resident KV only up to that answer. Here the fast path
on the trained demo checkpoint (fp32, CPU). Its answers happen to re-tokenise to the ids it generated, so the case
where they do not is tested on the contract itself: tests/inference_api/test_follow_up_ids.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from medgemma_xray.inference_api.contract import Prompt
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image

QUESTIONS = ("What are the main findings?", "And the heart?", "Any pleural effusion?")


@pytest.fixture(scope="module")
def film():
    return model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=0), 8))))


@pytest.fixture(scope="module")
def backend(demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    fast = FastTorchInference(demo_model_dir, device="cpu", slots=4, max_sequence=1024, prefix_cache_gib=0)
    yield fast
    fast.close()


def blank_answers(request: GenerationRequest) -> GenerationRequest:
    turns = tuple(ChatTurn(t.role, "" if t.role == "assistant" else t.text) for t in request.turns)
    return replace(request, turns=turns)


def answer_from_ids(backend, film, ids: list[int], max_new_tokens: int) -> GenerationStats:
    """A fresh conversation (nothing resident, no shared prefix) fed exactly `ids` as its prompt."""
    stats = GenerationStats()
    encode = backend._encode_impl
    backend._encode_impl = lambda request: Prompt(ids=list(ids), image=film, image_key=None)
    try:
        backend.generate(GenerationRequest(film, (ChatTurn("user", "?"),), max_new_tokens), stats)
    finally:
        del backend._encode_impl
    assert backend._encode_impl == encode
    return stats


def test_follow_ups_reuse_every_token_of_the_previous_turns(backend, film):
    backend.forget_all()
    turns: tuple[ChatTurn, ...] = ()
    history: list[int] = []  # the token history: prompts with every earlier answer as its generated ids
    previous: GenerationStats | None = None
    skeleton: list[int] = []
    for question in QUESTIONS:
        turns = (*turns, ChatTurn("user", question))
        request = GenerationRequest(film, turns, max_new_tokens=24, conversation_id="case")
        new_skeleton = backend._encode_impl(blank_answers(request)).ids
        assert new_skeleton[: len(skeleton)] == skeleton
        history = [*history, *(previous.token_ids if previous else []), *new_skeleton[len(skeleton) :]]
        skeleton = new_skeleton
        stats = GenerationStats()
        answer = backend.generate(request, stats)
        assert stats.prompt_tokens == len(history)
        if previous is not None:
            assert previous.finish_reason == "stop"  # so every token of the previous answer was fed
            assert stats.reused_tokens == previous.prompt_tokens + previous.new_tokens
            alone = answer_from_ids(backend, film, history, 24)
            assert alone.reused_tokens == 0 and alone.prefix_cached_tokens == 0
            assert stats.token_ids == alone.token_ids
        previous = stats
        turns = (*turns, ChatTurn("assistant", answer))
    backend.forget_all()


def test_an_edited_history_is_not_continued(backend, film):
    """A previous answer the conversation did not give (cleared, rewritten by a client) is encoded as text, and the
    answer is the one a conversation with no resident KV gives."""
    backend.forget_all()
    first = GenerationRequest(film, (ChatTurn("user", QUESTIONS[0]),), max_new_tokens=24, conversation_id="case")
    first_stats = GenerationStats()
    answer = backend.generate(first, first_stats)
    turns = (*first.turns, ChatTurn("assistant", "Edited: " + answer), ChatTurn("user", QUESTIONS[1]))
    edited = GenerationRequest(film, turns, max_new_tokens=24, conversation_id="case")
    stats = GenerationStats()
    backend.generate(edited, stats)
    assert stats.reused_tokens <= first_stats.prompt_tokens
    assert stats.prompt_tokens == len(backend._encode_impl(edited).ids)
    backend.forget_all()
    fresh = GenerationStats()
    backend.generate(replace(edited, conversation_id=None), fresh)
    assert fresh.reused_tokens == 0 and fresh.token_ids == stats.token_ids


def test_two_answers_under_one_conversation_id_free_every_slot(backend, film):
    """Two generations at once under one id run on two slots; when both end, one stays resident and the other's
    slot comes back (before the fix it was overwritten in the resident table without being freed)."""
    backend.forget_all()
    request = GenerationRequest(film, (ChatTurn("user", QUESTIONS[0]),), max_new_tokens=4, conversation_id="case")
    one, two = backend.start(request), backend.start(request)
    assert one.conversation is not two.conversation
    backend.prepare_images([one, two])
    while not all(backend.prefill_batch([one, two])):
        pass
    while not (one.done and two.done):
        backend.step([one, two])
    backend.finish(one)
    backend.finish(two)
    assert backend.resident_conversations == ["case"]
    backend.forget("case")
    assert sorted(backend._free_rows) == [0, 1, 2, 3]
