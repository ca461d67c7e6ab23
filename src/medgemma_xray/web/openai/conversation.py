"""OpenAI messages as this model's conversation: an optional system text, alternating turns, and one film.

MedGemma's chat template has no system turn of its own: it puts the system text before the first user turn, and so
does the backend (inference_api.chat). A system (or developer) message is therefore honoured as the request's
system prompt; only the first message may be one. The film is the one image of the conversation, in the first user
message, where MedGemma's chat format places it.

Two images in that message are a comparison with a prior film, in the order of Google-Health/medgemma's
cxr_longitudinal_comparison notebook: the prior first, then the current film, then the text. They are accepted only
where the serving checkpoint compares films (MedGemma 1.5: the "longitudinal" capability); elsewhere the door
answers 400 prior_film_unsupported, as every other door refuses a prior there (web/asking.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from medgemma_xray.inference_api.types import ChatTurn
from medgemma_xray.web.openai.errors import bad_request
from medgemma_xray.web.openai.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    SystemMessage,
    message_images,
    message_text,
)


@dataclass(frozen=True)
class Conversation:
    system_prompt: str | None
    turns: tuple[ChatTurn, ...]
    film_url: str
    prior_url: str | None = None  # the earlier film of a comparison (the first of two images)


def conversation_of(request: ChatCompletionRequest) -> Conversation:
    system_prompt: str | None = None
    turns: list[ChatTurn] = []
    film_urls: list[str] = []
    for index, message in enumerate(request.messages):
        text = message_text(message.content)
        if isinstance(message, SystemMessage):
            if index != 0:
                raise bad_request(
                    f"messages[{index}] is a {message.role} message; only the first message may be one (MedGemma "
                    "puts the system text before the first user turn).",
                    param=f"messages[{index}].role",
                )
            system_prompt = text
            continue
        images = message_images(message)
        if images and turns:
            raise bad_request(
                f"messages[{index}] carries an image; put the film in the first user message (MedGemma's chat "
                "format has it there).",
                param=f"messages[{index}].content",
                code="one_film_required",
            )
        film_urls.extend(images)
        role: Literal["user", "assistant"] = "assistant" if isinstance(message, AssistantMessage) else "user"
        expected = "user" if len(turns) % 2 == 0 else "assistant"
        if role != expected:
            raise bad_request(
                f"messages[{index}] is a {role} message where a {expected} message belongs: after an optional "
                "system message, turns alternate user, assistant, user, ... and end with the user's question.",
                param=f"messages[{index}].role",
            )
        turns.append(ChatTurn(role, text))
    if len(film_urls) not in (1, 2):
        raise bad_request(
            "Send one chest film, as an image_url part of the first user message, or two to compare the current "
            f"film with a prior (the prior first) (found {len(film_urls)}): this assistant answers about one film "
            "per conversation.",
            param="messages",
            code="one_film_required",
        )
    if not turns or turns[-1].role != "user":
        raise bad_request("The last message must be the user's question.", param="messages")
    if not turns[-1].text.strip():
        raise bad_request("The question is empty; add a text part with the question.", param="messages")
    if len(film_urls) == 2:
        return Conversation(system_prompt, tuple(turns), film_urls[1], prior_url=film_urls[0])
    return Conversation(system_prompt, tuple(turns), film_urls[0])
