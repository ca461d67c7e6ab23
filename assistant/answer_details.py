"""The line of details shown under each answer: tokens, latency, speed and confidence, for a teacher at a glance."""

from __future__ import annotations

from assistant.confidence import CONFIDENCE_EXPLANATION, Confidence, answer_confidence
from inference_api.types import GenerationStats


def _quote(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    # Backticks keep the model's words from being read as Markdown; a backtick inside would close the code span.
    return "`" + text.replace("`", "'") + "`" if text else "(no visible text)"


def stats_confidence(stats: GenerationStats) -> Confidence | None:
    return answer_confidence(stats.token_ids, stats.token_logprobs, stats.token_texts)


def answer_details_markdown(stats: GenerationStats, explain: bool = True) -> str:
    """Markdown for under an answer, e.g.

    **42 tokens** · 1.23 s (first token 0.10 s) · 34.1 tokens/s · confidence **87%**, lowest 12% at `pleural`
    followed, if explain, by one line saying what confidence is and is not.
    """
    parts = [f"**{stats.new_tokens} tokens**"]
    if stats.total_s is not None:
        latency = f"{stats.total_s:.2f} s"
        if stats.first_token_s is not None:
            latency += f" (first token {stats.first_token_s:.2f} s)"
        parts.append(latency)
    if stats.tokens_per_s is not None:
        parts.append(f"{stats.tokens_per_s:.1f} tokens/s")
    if stats.finish_reason == "length":
        parts.append("stopped at the token limit")
    elif stats.finish_reason == "cancelled":
        parts.append("stopped early")
    confidence = stats_confidence(stats)
    if confidence is None:
        parts.append("confidence: no tokens")
    else:
        parts.append(
            f"confidence **{confidence.mean_probability:.0%}**, lowest {confidence.min_probability:.0%}; least sure "
            f"at {_quote(confidence.lowest_span)} ({confidence.lowest_span_probability:.0%})"
        )
    text = " · ".join(parts)
    if explain:
        text += f"\n\n<small>{CONFIDENCE_EXPLANATION}</small>"
    return text
