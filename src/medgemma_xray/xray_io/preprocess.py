"""MedGemma's own preparation before its processor: 3 channels, zero-pad to square (as in training)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from medgemma_xray.xray_io.radiograph import Radiograph

if TYPE_CHECKING:
    from PIL import Image


def pad_to_square(pixels: np.ndarray) -> np.ndarray:
    """Centre the film on a black square; the processor then resizes to 896 without distorting anatomy."""
    rows, cols = pixels.shape[:2]
    side = max(rows, cols)
    top, left = (side - rows) // 2, (side - cols) // 2
    square = np.zeros((side, side) + pixels.shape[2:], dtype=pixels.dtype)
    square[top : top + rows, left : left + cols] = pixels
    return square


def model_input_image(film: Radiograph) -> Image.Image:
    """The exact PIL image handed to the processor (and shown to the user as 'what the model sees')."""
    from PIL import Image

    square = pad_to_square(film.pixels)
    return Image.fromarray(np.repeat(square[:, :, None], 3, axis=2), mode="RGB")


MODEL_INPUT_SIDE = 896  # MedGemma's processor size: it resizes every image to this (bilinear) anyway
PREVIEW_SIDE = 512  # the film kept with a case for display and facts: its longest side


@dataclass(frozen=True)
class CaseImages:
    """What a case keeps of a film once it is loaded: the model's input already at the processor's size, and a
    small copy of the film (same source, warnings and view). A 6000 x 6000 film costs 2.4 MB kept instead of
    144 MB (the full film plus its full-size padded RGB square).

    model_image: RGB, MODEL_INPUT_SIDE square; the processor's own bilinear resize of the padded film, done here
        (Pillow, as the processor does), so the model sees the same pixels. full_shape: the film's (rows, columns).
    """

    model_image: Image.Image
    preview: Radiograph
    full_shape: tuple[int, int]


def case_images(film: Radiograph, side: int = MODEL_INPUT_SIDE, preview_side: int = PREVIEW_SIDE) -> CaseImages:
    from PIL import Image

    square = pad_to_square(film.pixels)
    gray = Image.fromarray(square, mode="L")
    del square
    # Resizing the gray square and then making 3 equal channels gives the same pixels as resizing the RGB one
    # (bilinear treats channels alike), at a third of the memory.
    small = gray.resize((side, side), Image.Resampling.BILINEAR) if gray.size != (side, side) else gray
    model_image = Image.merge("RGB", (small, small, small))
    rows, cols = film.shape
    scale = min(1.0, preview_side / max(rows, cols))
    thumbnail = Image.fromarray(film.pixels, mode="L").resize(
        (max(1, round(cols * scale)), max(1, round(rows * scale))), Image.Resampling.BILINEAR
    )
    preview = replace(film, pixels=np.asarray(thumbnail).copy())
    return CaseImages(model_image=model_image, preview=preview, full_shape=(rows, cols))
