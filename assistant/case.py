"""One case on the screen: the film the model sees and the conversation about it. Per browser session."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from inference_api.types import ChatTurn, GenerationRequest
from xray_io import Radiograph

EXAMPLE_QUESTIONS = (
    "What are the main findings on this chest X-ray?",
    "Is there a pneumothorax or pleural effusion?",
    "Describe the heart size and the mediastinum.",
    "Are there any lines, tubes or devices? Where do they terminate?",
    "What is the differential diagnosis for the most prominent abnormality?",
    "Is this film technically adequate (rotation, inspiration, penetration)?",
)


@dataclass(frozen=True)
class Case:
    film: Radiograph | None = None
    model_image: object = None  # PIL image handed to the processor (padded square, RGB)
    turns: tuple[ChatTurn, ...] = field(default=())
    # One id per uploaded film: the backend keeps this conversation's KV cache between turns under it.
    conversation_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    details: tuple[str, ...] = field(default=())  # per answer: tokens, latency, speed, confidence (Markdown)

    @property
    def has_film(self) -> bool:
        return self.film is not None

    def ask(self, question: str, max_new_tokens: int) -> GenerationRequest:
        return GenerationRequest(
            image=self.model_image,
            turns=(*self.turns, ChatTurn("user", question)),
            max_new_tokens=max_new_tokens,
            conversation_id=self.conversation_id,
        )

    def answered(self, question: str, answer: str, details: str = "") -> Case:
        turns = (*self.turns, ChatTurn("user", question), ChatTurn("assistant", answer))
        return replace(self, turns=turns, details=(*self.details, details))

    def chat_messages(self) -> list[dict]:
        """The conversation for the chat box: each answer followed by its details line (the model never sees it)."""
        messages, answers = [], iter(self.details)
        for turn in self.turns:
            content = turn.text
            if turn.role == "assistant":
                details = next(answers, "")
                content = f"{content}\n\n{details}" if details else content
            messages.append({"role": turn.role, "content": content})
        return messages


def case_for_film(film: Radiograph) -> tuple[Case, object]:
    """A new case for a freshly loaded film, holding only what the case needs (issue 19, section 2): the model's
    input at the processor's size and a small copy of the film. The full-resolution pixels are not kept, so an idle
    session costs megabytes, not the film's hundreds. Returns (case, model image); the model image is also the
    preview the user sees."""
    from xray_io.preprocess import case_images

    images = case_images(film)
    return Case(film=images.preview, model_image=images.model_image), images.model_image
