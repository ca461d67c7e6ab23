"""MedGemma's own preparation before its processor: 3 channels, zero-pad to square (as in training)."""

from __future__ import annotations

import numpy as np

from xray_io.radiograph import Radiograph


def pad_to_square(pixels: np.ndarray) -> np.ndarray:
    """Centre the film on a black square; the processor then resizes to 896 without distorting anatomy."""
    rows, cols = pixels.shape[:2]
    side = max(rows, cols)
    top, left = (side - rows) // 2, (side - cols) // 2
    square = np.zeros((side, side) + pixels.shape[2:], dtype=pixels.dtype)
    square[top : top + rows, left : left + cols] = pixels
    return square


def model_input_image(film: Radiograph):
    """The exact PIL image handed to the processor (and shown to the user as 'what the model sees')."""
    from PIL import Image

    square = pad_to_square(film.pixels)
    return Image.fromarray(np.repeat(square[:, :, None], 3, axis=2), mode="RGB")
