"""Per-request limits, as settings: questions per conversation and the size of one question. Each refusal says
what the limit is and what to do. (The answer's time limit and the queues' sizes are the scheduler's and Gradio's:
REQUEST_TIMEOUT_S, QUEUE_SIZE.)"""

from __future__ import annotations

import re
from dataclasses import dataclass

from medgemma_xray.inference_api.errors import RequestError

# Gemma's chat and image markers. Its tokenizer turns them into control tokens even inside user text, so a question
# could fake a model turn or add image slots (which fails as "2 image tokens but 1 image").
CONTROL_MARKERS = re.compile(r"<(?:start_of_turn|end_of_turn|start_of_image|end_of_image|image_soft_token|bos|eos)>")


class LimitExceeded(RequestError):
    """The request is over one of the server's limits; the message names the limit and the way out."""


@dataclass(frozen=True)
class RequestLimits:
    max_turns: int
    max_prompt_tokens: int

    @classmethod
    def from_settings(cls, settings) -> RequestLimits:
        return cls(settings.max_turns, settings.max_prompt_tokens)

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
