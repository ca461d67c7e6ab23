"""The benchmark's inputs: one fixed film and question, a five-turn conversation, and a folder's worth of films."""

from __future__ import annotations

from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image

# 40 words, as the measurements behind the targets used.
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
    return model_input_image(load_radiograph(data))


def question_request(image, max_new_tokens: int, conversation_id: str | None = None) -> GenerationRequest:
    return GenerationRequest(image, (ChatTurn("user", QUESTION),), max_new_tokens, conversation_id=conversation_id)


def films(count: int) -> list:
    return [film(seed) for seed in range(count)]


# A teaching round: a long first question about the student's own film, then short follow-ups in one case.
TEACHING_FOLLOW_UPS = FOLLOW_UPS[:3]
# A class on one film: each student words the first question a little differently.
CLASS_QUESTIONS = (
    QUESTION,
    "What do you see on this chest film? Go through the lungs, the heart and the bones.",
    "Is this film normal? If not, what is the main abnormality and where is it?",
    "Describe this radiograph as you would to a colleague on the ward round.",
)


def conversation_request(
    image, questions_and_answers: list[tuple[str, str]], question: str, max_new_tokens: int, conversation_id: str
) -> GenerationRequest:
    """The next turn of a case: the earlier questions and answers, then `question`."""
    turns: list[ChatTurn] = []
    for asked, answered in questions_and_answers:
        turns += [ChatTurn("user", asked), ChatTurn("assistant", answered)]
    turns.append(ChatTurn("user", question))
    return GenerationRequest(image, tuple(turns), max_new_tokens, conversation_id=conversation_id)


def film_variants(count: int, seed: int = 0) -> list:
    """`count` distinct films, cheaply: one phantom (about a second to draw) with a different random 64x64 patch
    each, so every film has its own content hash (no cache can serve one film for another) at no drawing cost."""
    import numpy as np
    from PIL import Image

    base = np.asarray(film(seed))
    rng = np.random.default_rng(seed)
    variants = []
    for _ in range(count):
        pixels = base.copy()
        row, col = rng.integers(0, pixels.shape[0] - 64), rng.integers(0, pixels.shape[1] - 64)
        pixels[row : row + 64, col : col + 64] = rng.integers(0, 256, (64, 64, 1), dtype=np.uint8)
        variants.append(Image.fromarray(pixels))
    return variants
