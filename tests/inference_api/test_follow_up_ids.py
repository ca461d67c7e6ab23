"""The contract's follow-up rule on a backend whose generated ids re-tokenise to other ids.

The scripted backend generates ids 97.. that decode to letters, which its encoder maps to other ids: exactly the
case of a real model whose answer text re-tokenises differently. A follow-up must still reuse every token of the
previous turns, and only when the history is the one the conversation answered.
"""

from __future__ import annotations

from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats, Mode
from tests.support.scripted_backend import ScriptedBackend

QUESTIONS = ("Findings?", "And the heart?", "Effusion?")


def ask(backend, turns, conversation_id="case") -> tuple[str, GenerationStats]:
    stats = GenerationStats()
    answer = backend.generate(GenerationRequest(None, turns, max_new_tokens=16, conversation_id=conversation_id), stats)
    return answer, stats


def test_follow_ups_reuse_every_token_of_the_previous_turns():
    with ScriptedBackend(Mode.PYTORCH) as backend:
        turns, previous = (), None
        for question in QUESTIONS:
            turns = (*turns, ChatTurn("user", question))
            answer, stats = ask(backend, turns)
            assert backend._encode_impl(GenerationRequest(None, (ChatTurn("user", answer),))).ids != stats.token_ids
            if previous is not None:
                assert previous.finish_reason == "stop"
                assert stats.reused_tokens == previous.prompt_tokens + previous.new_tokens
            previous, turns = stats, (*turns, ChatTurn("assistant", answer))


def test_an_edited_answer_or_another_earlier_turn_is_encoded_as_text():
    with ScriptedBackend(Mode.PYTORCH) as backend:
        first = (ChatTurn("user", QUESTIONS[0]),)
        answer, stats = ask(backend, first)
        turns = (*first, ChatTurn("assistant", answer), ChatTurn("user", QUESTIONS[1]))
        _, follow_up = ask(backend, turns)
        assert follow_up.reused_tokens == stats.prompt_tokens + stats.new_tokens
        second = (*turns, ChatTurn("assistant", "an answer it never gave"), ChatTurn("user", QUESTIONS[2]))
        _, rewritten = ask(backend, second)
        expected = backend._encode_impl(GenerationRequest(None, second)).ids
        assert rewritten.prompt_tokens == len(expected)  # the text as it is, not the generated ids
        assert rewritten.reused_tokens < follow_up.prompt_tokens
        backend.forget("case")
        _, again = ask(backend, turns)  # nothing resident: the text, and no reuse
        assert again.reused_tokens == 0
        assert again.prompt_tokens == len(backend._encode_impl(GenerationRequest(None, turns)).ids)


def test_two_answers_under_one_conversation_id_leave_no_slot_taken():
    with ScriptedBackend(Mode.PYTORCH, slots=4) as backend:
        request = GenerationRequest(None, (ChatTurn("user", "Findings?"),), max_new_tokens=4, conversation_id="case")
        one, two = backend.start(request), backend.start(request)
        while not all(backend.prefill_batch([one, two])):
            pass
        while not (one.done and two.done):
            backend.step([one, two])
        backend.finish(one)
        backend.finish(two)
        assert backend.resident_conversations == ["case"] and backend.free_slots == 3
        backend.forget("case")
        assert backend.free_slots == 4
