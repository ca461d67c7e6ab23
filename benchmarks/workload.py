"""The benchmark's inputs: one fixed film and question, a five-turn conversation, and a folder's worth of films."""

from __future__ import annotations

from inference_api.types import ChatTurn, GenerationRequest
from phantoms.films import chest_phantom, png_bytes, quantize
from xray_io import load_radiograph
from xray_io.preprocess import model_input_image

# 40 words, as the measurements used.
QUESTION = (
    "Please review this frontal chest radiograph from our teaching file and describe the lungs, pleura, heart size, "
    "mediastinal contours, bones and any lines or devices, then give the most likely diagnosis and the next step."
)
FOLLOW_UPS = (
    "Is there a pleural effusion on either side?",
    "How would you describe the heart size?",
    "Are there any lines, tubes or devices?",
    "What would you put in the impression?",
)


def film(seed: int = 0):
    """A synthetic PA phantom, through the serving preprocessing (padded square RGB)."""
    data = png_bytes(quantize(chest_phantom(rows=1024, cols=896, seed=seed), 8))
    return model_input_image(load_radiograph(data, "benchmark.png"))


def question_request(image, max_new_tokens: int, conversation_id: str | None = None) -> GenerationRequest:
    return GenerationRequest(image, (ChatTurn("user", QUESTION),), max_new_tokens, conversation_id=conversation_id)


def films(count: int) -> list:
    return [film(seed) for seed in range(count)]
