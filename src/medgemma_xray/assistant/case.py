"""One case on the screen: the film the model sees and the conversation about it. Per browser session.

The case is the whole of what the model answers from: the screen shows exactly it. Clearing the film gives an empty
case; clearing the chat gives a new conversation (new id, so no cached KV is reused) on the same film.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
from medgemma_xray.xray_io import Radiograph

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
    film: Radiograph | None = None  # a small copy of the film (source, warnings, view), never the full pixels
    model_image: object = None  # PIL image handed to the processor (padded square, RGB, 896 px)
    turns: tuple[ChatTurn, ...] = field(default=())
    # One id per uploaded film: the backend keeps this conversation's KV cache between turns under it.
    conversation_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    details: tuple[str, ...] = field(default=())  # per answer: tokens, latency, speed, confidence (Markdown)
    film_number: int = 0  # films loaded in this session so far: the non-identifying label "film-N" of this one
    image_key: str | None = None  # the model image's content hash (GenerationRequest.image_key)

    @property
    def has_film(self) -> bool:
        return self.film is not None

    @property
    def film_label(self) -> str:
        """A label that names the film without identifying anyone (file names may hold patient names)."""
        return f"film-{self.film_number}"

    def with_film(self, film: Radiograph, model_image, image_key: str | None = None) -> Case:
        """A new case on another film: a new conversation, the session's film count one up. film: what the case
        keeps of it (web's intake gives a small copy); model_image: the processor's input."""
        return Case(film=film, model_image=model_image, film_number=self.film_number + 1, image_key=image_key)

    def cleared(self) -> Case:
        """No film, no conversation (the session's film count is kept, so labels stay unique)."""
        return Case(film_number=self.film_number)

    def new_conversation(self) -> Case:
        """The same film, no turns, and a new conversation id: the backend starts from the film alone."""
        return replace(self, turns=(), details=(), conversation_id=uuid.uuid4().hex)

    def ask(self, question: str, max_new_tokens: int) -> GenerationRequest:
        return GenerationRequest(
            image=self.model_image,
            turns=(*self.turns, ChatTurn("user", question)),
            max_new_tokens=max_new_tokens,
            conversation_id=self.conversation_id,
            image_key=self.image_key,
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
