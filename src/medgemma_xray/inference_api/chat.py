"""The conversation as Hugging Face chat messages: what both backends render with the model's own chat template."""

from __future__ import annotations

from typing import Any

from medgemma_xray.inference_api.types import GenerationRequest


def chat_messages(request: GenerationRequest, image_placeholder: Any = None) -> list[dict[str, Any]]:
    """System prompt, then the turns; the image goes in the first user turn (MedGemma's examples do the same)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": request.system_prompt}]}]
    for index, turn in enumerate(request.turns):
        content: list[dict[str, Any]] = []
        if index == 0:
            image = image_placeholder if image_placeholder is not None else request.image
            content.append({"type": "image", "image": image})
        content.append({"type": "text", "text": turn.text})
        messages.append({"role": turn.role, "content": content})
    return messages
