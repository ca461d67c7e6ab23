"""The conversation as Hugging Face chat messages: what both backends render with the model's own chat template."""

from __future__ import annotations

from typing import Any

from medgemma_xray.inference_api.types import GenerationRequest


def chat_messages(
    request: GenerationRequest, image_placeholder: Any = None, prior_placeholder: Any = None
) -> list[dict[str, Any]]:
    """System prompt, then the turns; the film goes in the first user turn (MedGemma's examples do the same).

    With a prior film that turn holds the prior first, then the current film, then the text, as
    Google-Health/medgemma's cxr_longitudinal_comparison notebook builds it ([prior_image, current_image, text]).
    The placeholders replace the images where a backend renders text only (it inserts the features itself);
    prior_placeholder defaults to image_placeholder."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": request.system_prompt}]}]
    if prior_placeholder is None:
        prior_placeholder = image_placeholder
    for index, turn in enumerate(request.turns):
        content: list[dict[str, Any]] = []
        if index == 0:
            if request.prior_image is not None:
                prior = prior_placeholder if prior_placeholder is not None else request.prior_image
                content.append({"type": "image", "image": prior})
            image = image_placeholder if image_placeholder is not None else request.image
            content.append({"type": "image", "image": image})
        content.append({"type": "text", "text": turn.text})
        messages.append({"role": turn.role, "content": content})
    return messages
