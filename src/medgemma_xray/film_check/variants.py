"""What residents upload instead of a clean film, made from a phantom: the film check's variant set.

Each maker takes an 8-bit film (2-D uint8, bright = attenuating) and a numpy Generator and returns the uploaded
picture (2-D uint8 or RGB uint8): a white or grey border (a scanned film, a PACS screenshot's frame), a tight crop
(lateral chest walls and costophrenic angles cut), an inverted film, a burned-in marker ("L PORTABLE AP"), JPEG at
quality 50, and a screenshot of a viewer with its toolbar and side panel (light or dark theme). A variant of a film
is still a film: the check must accept it (inverted: flag it); benchmarks/film_check_variants.py measures this on
held-out phantoms, with the non-films of film_check.negatives beside them.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without sized default fonts
        return ImageFont.load_default()


def padded(film: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A flat border of 20-60 px (white for a scanned film, light grey for a PACS frame)."""
    width = int(rng.integers(20, 61))
    value = int(rng.choice([255, 255, 230, 200]))
    return np.pad(film, width, constant_values=value)


def cropped(film: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A tight crop: 8-16 % off each side and the top, 5-12 % off the bottom."""
    rows, cols = film.shape
    left, right = (int(cols * rng.uniform(0.08, 0.16)) for _ in range(2))
    top, bottom = int(rows * rng.uniform(0.08, 0.16)), int(rows * rng.uniform(0.05, 0.12))
    return film[top : rows - bottom, left : cols - right]


def inverted(film: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return 255 - film


def marker_text(film: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A burned-in marker in a top corner, white, about 5 % of the film's height."""
    from PIL import Image, ImageDraw

    picture = Image.fromarray(film)
    rows, cols = film.shape
    size = max(12, rows // 20)
    text = str(rng.choice(["L PORTABLE AP", "R SUPINE AP", "L ERECT PA", "PORTABLE"]))
    x = int(cols * rng.uniform(0.03, 0.08)) if rng.uniform() < 0.5 else int(cols * 0.55)
    ImageDraw.Draw(picture).text((x, int(rows * rng.uniform(0.02, 0.06))), text, fill=255, font=_font(size))
    return np.asarray(picture)


def jpeg50(film: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(film).save(buffer, format="JPEG", quality=50)
    return np.asarray(Image.open(buffer).convert("L"))


def screenshot(film: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The film inside a viewer's window: a toolbar with buttons and text above, a side panel with a study list,
    on a dark or light theme, saved as RGB."""
    from PIL import Image, ImageDraw

    rows, cols = film.shape
    dark = rng.uniform() < 0.5
    background, chrome, ink = ((24, 24, 28), (45, 48, 56), (220, 220, 220)) if dark else (
        (236, 236, 236), (250, 250, 250), (30, 30, 30))  # fmt: skip
    bar, panel, margin = max(24, rows // 14), max(80, cols // 4), int(rng.integers(6, 20))
    canvas = Image.new("RGB", (panel + cols + 2 * margin, bar + rows + 2 * margin), background)
    draw = ImageDraw.Draw(canvas)
    draw.rectangle((0, 0, canvas.width, bar), fill=chrome)
    font = _font(max(10, bar // 2))
    for index, label in enumerate(("File", "Window", "Zoom", "Measure", "Layout", "Export")):
        draw.text((10 + index * (bar * 3), bar // 4), label, fill=ink, font=font)
    draw.rectangle((0, bar, panel, canvas.height), fill=chrome)
    for line in range(min(12, (canvas.height - bar) // (bar + 4))):
        draw.text((8, bar + 8 + line * (bar + 4)), f"Study {line + 1}  CR CHEST", fill=ink, font=font)
    canvas.paste(Image.fromarray(film).convert("RGB"), (panel + margin, bar + margin))
    return np.asarray(canvas)


VARIANT_KINDS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "padded": padded,
    "cropped": cropped,
    "inverted": inverted,
    "marker text": marker_text,
    "JPEG q50": jpeg50,
    "screenshot": screenshot,
}


def variant_png(kind: str, film: np.ndarray, seed: int) -> bytes:
    """The variant as the PNG a resident would upload."""
    from PIL import Image

    picture = VARIANT_KINDS[kind](film, np.random.default_rng([seed, list(VARIANT_KINDS).index(kind), 0x36]))
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    return buffer.getvalue()
