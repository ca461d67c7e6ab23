"""One case on the screen: the film the model sees and the conversation about it. Per browser session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
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

# A structured report is two focused questions, so the sections exist whatever the model's formatting habits.
REPORT_SECTIONS = (
    ("Findings", "Describe the findings on this chest X-ray systematically: lungs, pleura, heart, mediastinum, "
                 "bones and devices. Be concise."),
    ("Impression", "Give the impression for this chest X-ray in one or two sentences."),
)  # fmt: skip
IMPRESSION_MAX_TOKENS = 120


@dataclass(frozen=True)
class Case:
    film: Radiograph | None = None
    model_image: object = None  # PIL image handed to the processor (padded square, RGB)
    turns: tuple[ChatTurn, ...] = field(default=())
    # One id per uploaded film: the backend keeps this conversation's KV cache between turns under it.
    conversation_id: str = field(default_factory=lambda: uuid.uuid4().hex)

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

    def answered(self, question: str, answer: str) -> Case:
        return replace(self, turns=(*self.turns, ChatTurn("user", question), ChatTurn("assistant", answer)))

    def chat_messages(self) -> list[dict]:
        return [{"role": turn.role, "content": turn.text} for turn in self.turns]


def stream_structured_report(case: Case, stream_answer, max_new_tokens: int) -> Iterator[str]:
    """Yield the report in Markdown as it grows: '### Findings' then '### Impression'."""
    done: list[str] = []
    for index, (title, prompt) in enumerate(REPORT_SECTIONS):
        budget = max_new_tokens if index == 0 else min(max_new_tokens, IMPRESSION_MAX_TOKENS)
        request = GenerationRequest(image=case.model_image, turns=(ChatTurn("user", prompt),), max_new_tokens=budget)
        text = ""
        for text in stream_answer(request):
            yield "\n\n".join([*done, f"### {title}\n{text}"])
        done.append(f"### {title}\n{text.strip() or '(no answer)'}")
    yield "\n\n".join(done)
