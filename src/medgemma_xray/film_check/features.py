"""Image statistics of a film, cheap enough to compute on every upload (a few milliseconds at any size).

What sets a frontal chest film apart is generic and model-free: a smooth grey picture (little pixel-to-pixel
noise), no large areas of paper white or of black inside the film, left and right nearly mirror images, and a fixed
layout: dark lungs either side of a bright mediastinum, the shoulders above and the bright abdomen below. The
features measure exactly these on the film with its zero padding cut away (so the pad-to-square step and the film's
aspect ratio do not matter), shrunk to 64 x 64 pixels.
"""

from __future__ import annotations

import numpy as np

SIDE = 64  # the thumbnail the statistics are taken on
GRID = 4  # the layout: mean brightness in GRID x GRID blocks
FEATURE_NAMES = (
    "log_high_frequency",
    "log_fine_high_frequency",
    "white_fraction",
    "black_fraction",
    "mirror_correlation",
    "brightness_std",
    *(f"block_{row}{col}" for row in range(GRID) for col in range(GRID)),
)


def _as_gray(image) -> np.ndarray:
    """A 2-D uint8 array from a Radiograph's pixels, a 2-D/3-D array or a PIL image."""
    if hasattr(image, "convert"):  # PIL
        image = np.asarray(image.convert("L"))
    pixels = np.asarray(image)
    if pixels.ndim == 3:
        pixels = pixels[..., :3].mean(axis=2)
    if pixels.ndim != 2 or min(pixels.shape) < 8:
        raise ValueError(f"expected a 2-D image of at least 8 x 8 pixels, got shape {pixels.shape}")
    return np.asarray(pixels, dtype=np.uint8) if pixels.dtype != np.uint8 else pixels


def content_box(pixels: np.ndarray) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the film inside its zero padding (rows and columns that are not all black)."""
    rows = np.flatnonzero(pixels.max(axis=1) > 0)
    cols = np.flatnonzero(pixels.max(axis=0) > 0)
    if rows.size < 8 or cols.size < 8:
        return 0, pixels.shape[0], 0, pixels.shape[1]
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def thumbnail(image, side: int = SIDE) -> np.ndarray:
    """The film's content (padding cut away) as a side x side float array in [0, 1]."""
    from PIL import Image

    pixels = _as_gray(image)
    top, bottom, left, right = content_box(pixels)
    picture = Image.fromarray(np.ascontiguousarray(pixels[top:bottom, left:right]))
    return np.asarray(picture.resize((side, side), Image.Resampling.BOX), dtype=np.float64) / 255.0


def _high_frequency(picture: np.ndarray) -> float:
    """Mean absolute Laplacian relative to the picture's spread: about 0.1-0.3 for a film, over 1 for noise."""
    laplacian = (
        4 * picture[1:-1, 1:-1] - picture[:-2, 1:-1] - picture[2:, 1:-1] - picture[1:-1, :-2] - picture[1:-1, 2:]
    )
    return float(np.abs(laplacian).mean() / (picture.std() + 1e-3))


def film_features(image) -> np.ndarray:
    """The feature vector (FEATURE_NAMES order) of a film: 2-D uint8 pixels, an RGB array or a PIL image."""
    picture = thumbnail(image)
    fine = thumbnail(image, SIDE * 2)
    mirrored = np.corrcoef(picture.ravel(), picture[:, ::-1].ravel())[0, 1]
    spread = picture.std()
    normalised = (picture - picture.mean()) / (spread + 1e-3)
    blocks = normalised.reshape(GRID, SIDE // GRID, GRID, SIDE // GRID).mean(axis=(1, 3)).ravel()
    return np.array(
        [
            np.log(_high_frequency(picture) + 1e-3),
            np.log(_high_frequency(fine) + 1e-3),
            float((picture > 0.9).mean()),
            float((picture < 0.06).mean()),
            0.0 if not np.isfinite(mirrored) else float(mirrored),
            float(spread),
            *blocks,
        ]
    )
