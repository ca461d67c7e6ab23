"""How sure the model was of its own words, from the log-probabilities of the tokens it generated.

Definitions (the README's "Confidence" paragraph says the same). For the n generated tokens of an answer, with
p_i = exp(logprob_i) the probability the model gave the token it chose:
- mean_probability = exp(mean of logprob_i): the geometric mean of p_i (1 / perplexity). One very unsure token
  pulls it down more than it would pull an arithmetic mean, which is what a reader wants to know about.
- min_probability = min p_i: the single least certain token.
- lowest_span: the run of SPAN_TOKENS consecutive tokens (fewer if the answer is shorter) with the lowest mean
  logprob, as text, with its geometric-mean probability: where the model hesitated most.
A non-finite logprob (NaN from a broken engine) counts as probability 0, so a fault never looks confident.

It is *not* the probability that the answer is right: a model can be certain of a wrong sentence, and greedy
decoding picks each word the model liked best, so these numbers are usually high. It is computed only from
(token_ids, logprobs, token texts), which both backends report through the same contract, so the same tokens give
the same confidence on PyTorch and TensorRT, up to the backends' logprob differences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

SPAN_TOKENS = 5

CONFIDENCE_EXPLANATION = (
    "Confidence is how sure the model was of its own words: the average probability it gave each word it wrote, "
    "the least sure word, and the stretch where it hesitated most. It is not the probability that the answer is "
    "right: a model can be confidently wrong. Use it to see where to look harder, never as a diagnostic score."
)


@dataclass(frozen=True)
class Confidence:
    """Confidence of one answer, or of the tokens behind one report field. Probabilities are in [0, 1]."""

    mean_probability: float
    min_probability: float
    lowest_span: str
    lowest_span_probability: float
    tokens: int

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        """Short text for the UI: "87% (lowest 12%)"."""
        return f"{self.mean_probability:.0%} (lowest {self.min_probability:.0%})"


def _finite(logprob: float) -> float:
    value = float(logprob)
    if math.isnan(value):
        return -math.inf
    return min(value, 0.0)  # a logprob a hair above 0 is rounding, not a probability above 1


def _geometric_mean(logprobs: Sequence[float]) -> float:
    if any(value == -math.inf for value in logprobs):
        return 0.0
    return math.exp(math.fsum(logprobs) / len(logprobs))


def answer_confidence(
    token_ids: Sequence[int], logprobs: Sequence[float], texts: Sequence[str], span_tokens: int = SPAN_TOKENS
) -> Confidence | None:
    """Confidence of the tokens given; None for an empty answer. The three sequences must have the same length."""
    if not len(token_ids) == len(logprobs) == len(texts):
        raise ValueError(
            f"token_ids, logprobs and texts must have one entry per token; got {len(token_ids)}, {len(logprobs)} "
            f"and {len(texts)}"
        )
    if not token_ids:
        return None
    values = [_finite(value) for value in logprobs]
    width = max(1, min(span_tokens, len(values)))
    window = math.fsum(values[:width]) if all(math.isfinite(v) for v in values[:width]) else -math.inf
    best_start, best_sum = 0, window
    for start in range(1, len(values) - width + 1):
        chunk = values[start : start + width]
        total = math.fsum(chunk) if all(math.isfinite(v) for v in chunk) else -math.inf
        if total < best_sum:  # strictly lower: ties keep the earliest span
            best_start, best_sum = start, total
    span_text = "".join(texts[best_start : best_start + width]).strip()
    return Confidence(
        mean_probability=_geometric_mean(values),
        min_probability=math.exp(min(values)),
        lowest_span=span_text,
        lowest_span_probability=_geometric_mean(values[best_start : best_start + width]),
        tokens=len(values),
    )


def token_offsets(texts: Sequence[str]) -> list[tuple[int, int]]:
    """Character range [start, end) of each token's text in their concatenation."""
    offsets, position = [], 0
    for text in texts:
        offsets.append((position, position + len(text)))
        position += len(text)
    return offsets


def span_confidence(
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    texts: Sequence[str],
    char_ranges: Sequence[tuple[int, int]],
    span_tokens: int = SPAN_TOKENS,
) -> Confidence | None:
    """Confidence of the tokens that wrote the characters in char_ranges (offsets into "".join(texts)).

    A token counts if any of its characters falls in a range; a token that added no text yet (half of a multi-byte
    character) counts with the character it leads into. None when no token falls in the ranges.
    """
    chosen = []
    for index, (start, end) in enumerate(token_offsets(texts)):
        for low, high in char_ranges:
            if (start < high and end > low) or (start == end and low <= start < high):
                chosen.append(index)
                break
    if not chosen:
        return None
    return answer_confidence(
        [token_ids[i] for i in chosen], [logprobs[i] for i in chosen], [texts[i] for i in chosen], span_tokens
    )
