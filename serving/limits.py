"""Per-request limits, as settings: questions per conversation, the size of one question, and how long an answer
may stream. Each refusal says what the limit is and what to do. (The queue's size is Gradio's own max_size.)"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

Update = TypeVar("Update")
# Gemma's chat and image markers. Its tokenizer turns them into control tokens even inside user text, so a question
# could fake a model turn or add image slots (which fails as "2 image tokens but 1 image").
CONTROL_MARKERS = re.compile(r"<(?:start_of_turn|end_of_turn|start_of_image|end_of_image|image_soft_token|bos|eos)>")


class LimitExceeded(ValueError):
    """The request is over one of the server's limits; the message names the limit and the way out."""


@dataclass(frozen=True)
class RequestLimits:
    max_turns: int
    max_prompt_tokens: int
    request_timeout_s: float

    @classmethod
    def from_settings(cls, settings) -> RequestLimits:
        return cls(settings.max_turns, settings.max_prompt_tokens, settings.request_timeout_s)

    def check_question(self, questions_so_far: int, question: str) -> None:
        if questions_so_far >= self.max_turns:
            raise LimitExceeded(
                f"This conversation has reached its limit of {self.max_turns} questions. "
                "Press New case and upload the film again to go on."
            )
        # Every token of Gemma's tokenizer covers at least one byte of text (byte fallback for the rest), so the
        # UTF-8 length bounds the token count from above without a tokenizer call.
        if len(question.encode("utf-8")) > self.max_prompt_tokens:
            raise LimitExceeded(
                f"The question is too long: at most {self.max_prompt_tokens} tokens (about as many characters) "
                "are accepted. Shorten it and ask again."
            )
        self.check_markers(question)

    @staticmethod
    def check_markers(question: str) -> None:
        found = CONTROL_MARKERS.search(question)
        if found:
            raise LimitExceeded(
                f"The question contains {found.group(0)}, a control marker of the model's chat format; "
                "remove it and ask again."
            )

    def bounded(self, updates: Iterator[Update]) -> Iterator[Update]:
        """Pass the updates through until the answer has streamed for request_timeout_s; then stop it (closing the
        source stops the backend's generation) and say so."""
        deadline = time.monotonic() + self.request_timeout_s
        try:
            for update in updates:
                yield update
                if time.monotonic() > deadline:
                    raise LimitExceeded(
                        f"The answer was stopped after {self.request_timeout_s:g} s, the server's time limit for one "
                        "answer. Ask a narrower question, or try again when the server is less busy."
                    )
        finally:
            close = getattr(updates, "close", None)
            if close is not None:
                close()
