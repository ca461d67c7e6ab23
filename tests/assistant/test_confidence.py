"""Confidence from token log-probabilities: the definitions, on numbers worked by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medgemma_xray.assistant.answer_details import answer_details_markdown, answer_metadata
from medgemma_xray.assistant.confidence import CONFIDENCE_EXPLANATION, answer_confidence, span_confidence, token_offsets
from medgemma_xray.inference_api.types import GenerationStats

LOG = math.log


def test_mean_is_the_geometric_mean_min_is_the_least_sure_token_and_the_span_is_the_lowest_window():
    probabilities = [0.9, 0.8, 0.9, 0.2, 0.3, 0.9, 0.95]
    texts = ["The", " lungs", " are", " maybe", " hazy", " at", " base"]
    confidence = answer_confidence(list(range(7)), [LOG(p) for p in probabilities], texts, span_tokens=2)
    assert confidence.mean_probability == pytest.approx(math.prod(probabilities) ** (1 / 7))
    assert confidence.min_probability == pytest.approx(0.2)
    assert confidence.lowest_span == "maybe hazy"  # 0.2 * 0.3 is the lowest product of two neighbours
    assert confidence.lowest_span_probability == pytest.approx(math.sqrt(0.2 * 0.3))
    assert confidence.tokens == 7
    assert confidence.label == f"{confidence.mean_probability:.0%} (lowest 20%)"


def test_span_is_the_whole_answer_when_shorter_than_the_window_and_ties_keep_the_first():
    short = answer_confidence([1, 2], [LOG(0.5), LOG(0.5)], ["a", "b"], span_tokens=5)
    assert short.lowest_span == "ab" and short.lowest_span_probability == pytest.approx(0.5)
    tie = answer_confidence([1, 2, 3], [LOG(0.5)] * 3, ["x", "y", "z"], span_tokens=1)
    assert tie.lowest_span == "x"


def test_non_finite_logprobs_count_as_probability_zero_and_tiny_positive_ones_as_one():
    confidence = answer_confidence([1, 2, 3], [float("nan"), 1e-7, LOG(0.5)], ["a", "b", "c"], span_tokens=1)
    assert confidence.mean_probability == 0.0 and confidence.min_probability == 0.0
    assert confidence.lowest_span == "a"
    assert answer_confidence([1], [1e-7], ["a"]).mean_probability == 1.0


def test_empty_answer_has_no_confidence_and_mismatched_lengths_are_refused():
    assert answer_confidence([], [], []) is None
    with pytest.raises(ValueError, match="one entry per token"):
        answer_confidence([1, 2], [0.0], ["a", "b"])


def test_span_confidence_takes_the_tokens_that_wrote_the_characters():
    texts = ["Lungs", ":", " clear", "\n", "Heart", ":", " big", ""]
    logprobs = [LOG(0.9), LOG(0.9), LOG(0.6), LOG(0.9), LOG(0.9), LOG(0.9), LOG(0.3), LOG(0.5)]
    offsets = token_offsets(texts)
    assert offsets[2] == (6, 12) and offsets[7] == (23, 23)
    clear = span_confidence(list(range(8)), logprobs, texts, [(7, 12)])  # "clear"
    assert clear.tokens == 1 and clear.mean_probability == pytest.approx(0.6)
    both = span_confidence(list(range(8)), logprobs, texts, [(7, 12), (20, 23)])  # "clear" and "big"
    assert both.tokens == 2 and both.mean_probability == pytest.approx(math.sqrt(0.6 * 0.3))
    assert span_confidence(list(range(8)), logprobs, texts, [(100, 110)]) is None


def test_a_token_without_text_yet_counts_with_the_character_it_leads_into():
    texts = ["a", "", "é", "b"]  # token 1 is the first byte of "é"
    confidence = span_confidence([1, 2, 3, 4], [LOG(0.9), LOG(0.2), LOG(0.8), LOG(0.9)], texts, [(1, 2)])
    assert confidence.tokens == 2 and confidence.min_probability == pytest.approx(0.2)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=-20.0, max_value=0.0), min_size=1, max_size=60),
    st.lists(st.floats(min_value=-1e-4, max_value=1e-4), min_size=60, max_size=60),
)
def test_logprobs_within_1e_4_give_confidences_within_1e_4(logprobs, noise):
    """What the cross-backend test relies on: backends whose logprobs agree within 1e-4 (fp32 PyTorch and the fp32
    bundle through ONNX Runtime agree within 1e-5) report the same confidence within 1e-4."""
    texts = [f"t{i}" for i in range(len(logprobs))]
    other = [min(0.0, value + delta) for value, delta in zip(logprobs, noise, strict=False)]
    first = answer_confidence(list(range(len(logprobs))), logprobs, texts)
    second = answer_confidence(list(range(len(logprobs))), other, texts)
    assert abs(first.mean_probability - second.mean_probability) <= 1e-4
    assert abs(first.min_probability - second.min_probability) <= 1e-4
    assert abs(first.lowest_span_probability - second.lowest_span_probability) <= 1e-4 or (
        first.lowest_span != second.lowest_span  # near-tied windows may swap; each is then within 1e-4 of the other
    )


def test_answer_details_show_tokens_latency_speed_and_confidence():
    stats = GenerationStats(
        new_tokens=4,
        first_token_s=0.1,
        total_s=2.0,
        finish_reason="length",
        token_ids=[5, 6, 7, 8],
        token_logprobs=[LOG(0.9), LOG(0.9), LOG(0.1), LOG(0.9)],
        token_texts=["No", " effusion", " `x`", "."],
    )
    text = answer_details_markdown(stats, explain=False)
    expected = 0.9**0.75 * 0.1**0.25
    assert text.startswith(f"confidence **{expected:.0%}**, lowest 10%")  # what a reader needs comes first
    assert "cut off at the token limit · 2.00 s (first token 0.10 s) · 2.0 tokens/s · 4 tokens · prompt" in text
    assert "least sure at `No effusion 'x'.`" in text  # the whole 4-token answer is the 5-token window
    folded = answer_details_markdown(stats)
    assert CONFIDENCE_EXPLANATION in folded and "not the probability that the answer is" in CONFIDENCE_EXPLANATION
    # One line shows (the summary); the figures and the explanation open on click.
    assert folded.startswith(
        f'<details class="answer-details"><summary>confidence {expected:.0%} · cut off at the token limit · 2.00 s · '
        "4 tokens</summary>"
    )
    assert text in folded and folded.endswith("</details>")
    assert answer_details_markdown(GenerationStats(), explain=False) == (
        "confidence: no tokens · 0 tokens · prompt 0 tokens, 0 reused from this conversation's cache"
    )


def test_an_answer_to_a_question_off_the_film_shows_no_percentage_but_the_reason():
    from medgemma_xray.assistant.question_scope import NOT_ABOUT_THE_FILM, confidence_withheld

    stats = GenerationStats(
        new_tokens=2, total_s=1.0, finish_reason="stop", token_ids=[5, 6],
        token_logprobs=[LOG(0.99), LOG(0.98)], token_texts=["Paris", "."],
    )  # fmt: skip
    reason = confidence_withheld("What is the capital of France?")
    assert reason == NOT_ABOUT_THE_FILM
    folded = answer_details_markdown(stats, withheld=reason)
    assert "%" not in folded.split("<small>", 1)[0], folded  # no figure anywhere above the explanation
    assert folded.startswith(f'<details class="answer-details"><summary>no confidence: {NOT_ABOUT_THE_FILM} · ')
    assert "patient's age" in confidence_withheld("How old is the patient?")
    assert confidence_withheld("Is there a pleural effusion?") is None
    assert answer_metadata(stats, reason)["confidence_withheld"] == reason
    assert answer_metadata(stats, reason)["confidence"] is not None  # the model's own figure stays in the JSON


def test_answer_metadata_is_numbers():
    stats = GenerationStats(
        prompt_tokens=300,
        reused_tokens=0,
        new_tokens=2,
        first_token_s=0.25,
        total_s=0.5,
        finish_reason="stop",
        token_ids=[5, 6],
        token_logprobs=[LOG(0.5), LOG(0.5)],
        token_texts=["No", "."],
    )
    metadata = answer_metadata(stats)
    assert metadata["generated_tokens"] == 2 and metadata["prompt_tokens"] == 300
    assert metadata["seconds"] == 0.5 and metadata["first_token_seconds"] == 0.25
    assert metadata["tokens_per_second"] == 4.0 and metadata["confidence"] == 0.5
    assert answer_metadata(GenerationStats())["confidence"] is None
