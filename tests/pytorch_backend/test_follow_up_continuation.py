"""A follow-up continues from the ids its conversation generated, not from their re-tokenised text (issue 20).

The previous answer's text re-tokenises to other ids than the model generated, so a follow-up encoded from text
alone reused the resident KV only up to that answer and re-prefilled the rest. Here the fast path on the demo
checkpoints (fp32, CPU): the trained one stops on its own, the random-weight one always runs to the token limit and
produces text whose re-tokenisation differs from what it generated.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from inference_api.contract import Prompt
from inference_api.types import ChatTurn, GenerationRequest, GenerationStats
from phantoms.films import chest_phantom, png_bytes, quantize
from xray_io import load_radiograph
from xray_io.preprocess import model_input_image

QUESTIONS = ("What are the main findings?", "And the heart?", "Any pleural effusion?")


@pytest.fixture(scope="module")
def film():
    return model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=0), 8)), "f.png"))


def fast_backend(model_dir):
    from pytorch_backend.fast import FastTorchInference

    return FastTorchInference(model_dir, device="cpu", slots=4, max_sequence=1024, prefix_cache_gib=0)


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


@pytest.mark.parametrize("checkpoint", ["trained", "random"])
def test_follow_ups_reuse_every_token_of_the_previous_turns(checkpoint, demo_model_dir, random_model_dir, film):
    model_dir = demo_model_dir if checkpoint == "trained" else random_model_dir
    backend = fast_backend(model_dir)
    try:
        turns: tuple[ChatTurn, ...] = ()
        history: list[int] = []  # the token history: prompts with every earlier answer as its generated ids
        previous: GenerationStats | None = None
        skeleton: list[int] = []
        retokenised_differs = False
        for question in QUESTIONS:
            turns = (*turns, ChatTurn("user", question))
            request = GenerationRequest(film, turns, max_new_tokens=12, conversation_id="case")
            new_skeleton = backend._encode_impl(blank_answers(request)).ids
            assert new_skeleton[: len(skeleton)] == skeleton
            history = [*history, *(previous.token_ids if previous else []), *new_skeleton[len(skeleton) :]]
            skeleton = new_skeleton
            retokenised_differs |= backend._encode_impl(request).ids != history
            stats = GenerationStats()
            answer = backend.generate(request, stats)
            assert stats.prompt_tokens == len(history)
            if previous is not None:
                # Every token fed in the previous turns: its prompt and its answer (an answer cut at the token limit
                # never fed its last token, so that one is prefilled now with the new question).
                fed = previous.prompt_tokens + previous.new_tokens - (previous.finish_reason == "length")
                assert stats.reused_tokens == fed
                alone = answer_from_ids(backend, film, history, 12)
                assert alone.reused_tokens == 0 and alone.prefix_cached_tokens == 0
                assert stats.token_ids == alone.token_ids
            previous = stats
            turns = (*turns, ChatTurn("assistant", answer))
        if checkpoint == "random":
            assert retokenised_differs  # the case this is about: text alone would not reach the resident KV
            assert previous.finish_reason == "length"
        else:
            assert previous.finish_reason == "stop"
    finally:
        backend.close()


def test_an_edited_history_is_not_continued(random_model_dir, film):
    """A previous answer the conversation did not give (cleared, rewritten by a client) is encoded as text, and the
    answer is the one a conversation with no resident KV gives."""
    backend = fast_backend(random_model_dir)
    try:
        first = GenerationRequest(film, (ChatTurn("user", QUESTIONS[0]),), max_new_tokens=8, conversation_id="case")
        first_stats = GenerationStats()
        answer = backend.generate(first, first_stats)
        turns = (*first.turns, ChatTurn("assistant", answer + " (edited)"), ChatTurn("user", QUESTIONS[1]))
        edited = GenerationRequest(film, turns, max_new_tokens=8, conversation_id="case")
        stats = GenerationStats()
        backend.generate(edited, stats)
        assert stats.reused_tokens < first_stats.prompt_tokens + first_stats.new_tokens - 1
        assert stats.prompt_tokens == len(backend._encode_impl(edited).ids)
        fresh = GenerationStats()
        backend.generate(replace(edited, conversation_id=None), fresh)
        assert fresh.reused_tokens == 0 and fresh.token_ids == stats.token_ids
    finally:
        backend.close()


def test_two_answers_under_one_conversation_id_free_every_slot(demo_model_dir, film):
    """Two generations at once under one id run on two slots; when both end, one stays resident and the other's
    slot comes back (it was overwritten in the resident table without being freed)."""
    backend = fast_backend(demo_model_dir)
    try:
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
        assert sorted(backend._free_slots) == [0, 1, 2, 3]
    finally:
        backend.close()
