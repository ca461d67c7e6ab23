"""Where an answer ends when the client gave stop strings, and which of its tokens a sent text covers.

As OpenAI does, the stop string itself is not returned and the finish reason is "stop". A stream holds back the
last few characters that could still be the start of a stop string, so nothing after one is ever sent.
"""

from __future__ import annotations

from medgemma_xray.inference_api.types import GenerationStats


class StopStrings:
    def __init__(self, strings: tuple[str, ...]) -> None:
        self.strings = strings
        self._hold_back = max((len(text) for text in strings), default=1) - 1

    def first_match(self, text: str) -> int | None:
        found = [index for index in (text.find(stop) for stop in self.strings) if index >= 0]
        return min(found) if found else None

    def matched_length(self, text: str, index: int) -> int:
        return max(len(stop) for stop in self.strings if text.startswith(stop, index))

    def safe_length(self, text: str) -> int:
        """How much of an unfinished answer can be sent: all of it but what could begin a stop string."""
        return max(0, len(text) - self._hold_back)


class TokenCursor:
    """How many generated tokens a prefix of the answer's text covers. The stats are filled on the scheduler's
    thread and can run ahead of the text this stream has, so only tokens whose text is in the prefix count."""

    def __init__(self, stats: GenerationStats) -> None:
        self.stats = stats
        self.tokens = 0
        self.chars = 0

    def covered(self, chars: int, through: bool = False) -> int:
        """Tokens whose text lies within the first `chars` characters; through=True adds the one that reaches
        past them (the token that completed a stop string was generated, so it counts)."""
        texts = self.stats.token_texts
        available = min(len(texts), len(self.stats.token_logprobs))
        while self.tokens < available:
            width = len(texts[self.tokens])
            if self.chars + width > chars and not (through and self.chars < chars):
                break
            self.chars += width
            self.tokens += 1
        return self.tokens
