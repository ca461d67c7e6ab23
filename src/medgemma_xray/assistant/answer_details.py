"""The details under each answer: one folded line that leads with what a reader needs (how sure the model was, or
why no figure is shown; whether the answer was cut off; how long it took), opening on click to the full figures,
the prompt's reuse of the conversation's cache, and what confidence means; and the same figures as numbers for a
report's metadata.

withheld: why the answer shows no confidence (assistant.question_scope: a question not about the film, or one the
film cannot answer). The model's words are fluent whatever it is asked, so a percentage there would read as
certainty about a guess."""

from __future__ import annotations

from medgemma_xray.assistant.confidence import CONFIDENCE_EXPLANATION, Confidence, answer_confidence
from medgemma_xray.inference_api.types import GenerationStats


def _quote(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    # Backticks keep the model's words from being read as Markdown; a backtick inside would close the code span.
    return "`" + text.replace("`", "'") + "`" if text else "(no visible text)"


def stats_confidence(stats: GenerationStats) -> Confidence | None:
    return answer_confidence(stats.token_ids, stats.token_logprobs, stats.token_texts)


def _finish(stats: GenerationStats) -> list[str]:
    if stats.finish_reason == "length":
        return ["cut off at the token limit"]
    if stats.finish_reason == "cancelled":
        return ["stopped early"]
    return []


def answer_summary(stats: GenerationStats, withheld: str | None = None) -> str:
    """The folded line, e.g. "confidence 87% · 1.23 s · 42 tokens", or "no confidence: the question is not about
    the film on screen · 1.23 s · 42 tokens"."""
    confidence = stats_confidence(stats)
    if withheld:
        parts = [f"no confidence: {withheld}"]
    else:
        parts = ["confidence: no tokens" if confidence is None else f"confidence {confidence.mean_probability:.0%}"]
    parts += _finish(stats)
    if stats.total_s is not None:
        parts.append(f"{stats.total_s:.2f} s")
    parts.append(f"{stats.new_tokens} tokens")
    return " · ".join(parts)


def answer_metadata(stats: GenerationStats, withheld: str | None = None) -> dict:
    """The answer's figures as numbers (None where not measured), for an export's metadata; the model's own
    confidence stays here even where the screen withholds it, with the reason."""
    confidence = stats_confidence(stats)
    return {
        "confidence_withheld": withheld,
        "generated_tokens": stats.new_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "seconds": None if stats.total_s is None else round(stats.total_s, 3),
        "first_token_seconds": None if stats.first_token_s is None else round(stats.first_token_s, 3),
        "tokens_per_second": None if stats.tokens_per_s is None else round(stats.tokens_per_s, 2),
        "confidence": None if confidence is None else round(confidence.mean_probability, 4),
        "lowest_token_confidence": None if confidence is None else round(confidence.min_probability, 4),
        "finish_reason": stats.finish_reason,
    }


def answer_details_markdown(stats: GenerationStats, explain: bool = True, withheld: str | None = None) -> str:
    """Markdown for under an answer: the folded line of answer_summary; opened, e.g.

    confidence **87%**, lowest 12%; least sure at `pleural` (12%) · 1.23 s (first token 0.10 s) · 34.1 tokens/s ·
    42 tokens · prompt 300 tokens, 0 reused from this conversation's cache
    followed, if explain, by one line saying what confidence is and is not. explain=False: the open text alone.
    """
    confidence = stats_confidence(stats)
    if withheld:
        parts = [f"**no confidence shown**: {withheld}"]
    elif confidence is None:
        parts = ["confidence: no tokens"]
    else:
        parts = [
            f"confidence **{confidence.mean_probability:.0%}**, lowest {confidence.min_probability:.0%}; least sure "
            f"at {_quote(confidence.lowest_span)} ({confidence.lowest_span_probability:.0%})"
        ]
    parts += _finish(stats)
    if stats.total_s is not None:
        latency = f"{stats.total_s:.2f} s"
        if stats.first_token_s is not None:
            latency += f" (first token {stats.first_token_s:.2f} s)"
        parts.append(latency)
    if stats.tokens_per_s is not None:
        parts.append(f"{stats.tokens_per_s:.1f} tokens/s")
    parts.append(f"{stats.new_tokens} tokens")
    parts.append(f"prompt {stats.prompt_tokens} tokens, {stats.reused_tokens} reused from this conversation's cache")
    text = " · ".join(parts)
    if not explain:
        return text
    # <details> folds it to one line on every screen; the chat box sanitises HTML but keeps details and summary.
    return (
        f'<details class="answer-details"><summary>{answer_summary(stats, withheld)}</summary>\n\n{text}\n\n'
        f"<small>{CONFIDENCE_EXPLANATION}</small>\n\n</details>"
    )
