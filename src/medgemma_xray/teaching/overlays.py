"""The pointing overlays drawn into the viewer's rendered picture: the key's regions, the student's marks and the
model's boxes, each labelled, at the view's zoom and pan (teaching.viewer.Crop maps film to view pixels).

Told apart by more than colour: the Okabe-Ito palette (distinguishable with the common colour-vision
deficiencies) and a line style per layer (key solid, student dashed, model dotted), with a legend drawn in the
picture's corner and, beside the picture, in words (LEGEND_MARKDOWN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from medgemma_xray.grounding.boxes import FilmBox
from medgemma_xray.teaching.marks import KEY_LAYER, LAYER_NAMES, LAYERS, MODEL_LAYER, STUDENT_LAYER, Mark, shown_name
from medgemma_xray.teaching.viewer import Crop

# Okabe & Ito (2008): sky blue, orange, reddish purple.
COLOURS = {KEY_LAYER: (86, 180, 233), STUDENT_LAYER: (230, 159, 0), MODEL_LAYER: (204, 121, 167)}
STYLES = {KEY_LAYER: "solid", STUDENT_LAYER: "dashed", MODEL_LAYER: "dotted"}
LINE_WIDTH = 3


def legend_markdown(drawn: Sequence[str]) -> str:
    """The legend in words, for the page beside the picture (a screen reader reads this, not the picture)."""
    colour_names = {KEY_LAYER: "sky blue", STUDENT_LAYER: "orange", MODEL_LAYER: "purple"}
    parts = [f"{LAYER_NAMES[layer]}: {colour_names[layer]}, {STYLES[layer]}" for layer in LAYERS if layer in drawn]
    return "**On the film:** " + "; ".join(parts) if parts else ""


@dataclass(frozen=True)
class Layers:
    """What to draw, in film fractions: the key's regions and the model's boxes as (finding, box), the student's
    marks. Hashable, so a view's cache key can hold it."""

    key: tuple[tuple[str, FilmBox], ...] = ()
    student: tuple[Mark, ...] = ()
    model: tuple[tuple[str, FilmBox], ...] = ()

    def drawn(self) -> tuple[str, ...]:
        """The layers with something to draw, in legend order."""
        have = {KEY_LAYER: self.key, STUDENT_LAYER: self.student, MODEL_LAYER: self.model}
        return tuple(layer for layer in LAYERS if have[layer])

    def __bool__(self) -> bool:
        return bool(self.drawn())


def _segments(start: tuple[float, float], end: tuple[float, float], style: str):
    """The pieces of a line in a style: one (solid), 10 on 6 off (dashed), 3 on 5 off (dotted)."""
    if style == "solid":
        yield start, end
        return
    on, off = (10.0, 6.0) if style == "dashed" else (3.0, 5.0)
    (x0, y0), (x1, y1) = start, end
    length = float(np.hypot(x1 - x0, y1 - y0))
    position = 0.0
    while position < length:
        a, b = position / max(length, 1e-9), min(position + on, length) / max(length, 1e-9)
        yield (x0 + (x1 - x0) * a, y0 + (y1 - y0) * a), (x0 + (x1 - x0) * b, y0 + (y1 - y0) * b)
        position += on + off


def _rectangle(draw, corners: tuple[float, float, float, float], layer: str) -> None:
    left, top, right, bottom = corners
    colour, style = COLOURS[layer], STYLES[layer]
    points = [(left, top), (right, top), (right, bottom), (left, bottom), (left, top)]
    for start, end in zip(points, points[1:], strict=False):
        for a, b in _segments(start, end, style):
            draw.line((*a, *b), fill=colour, width=LINE_WIDTH)


def _label(draw, font, at: tuple[float, float], text: str, layer: str, size: tuple[int, int]) -> None:
    """A label in the layer's colour on a dark plate, kept inside the picture."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    width, height = right - left + 6, bottom - top + 4
    x = min(max(at[0], 0), size[0] - width)
    y = min(max(at[1] - height, 0), size[1] - height)
    draw.rectangle((x, y, x + width, y + height), fill=(0, 0, 0))
    draw.text((x + 3 - left, y + 2 - top), text, fill=COLOURS[layer], font=font)


def draw_layers(picture: np.ndarray, crop: Crop, shape: tuple[int, int], layers: Layers) -> np.ndarray:
    """The rendered view (grey or RGB) with the layers drawn: RGB uint8, the same size. shape: the film's
    (rows, columns), which the fractions are of. A mark outside the view's crop is clipped by the picture."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.fromarray(picture).convert("RGB")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=14)
    rows, cols = shape

    def view_point(y: float, x: float) -> tuple[float, float]:
        return crop.to_view(y * rows - 0.5, x * cols - 0.5)

    def corners(y0: float, x0: float, y1: float, x1: float) -> tuple[float, float, float, float]:
        (left, top), (right, bottom) = view_point(y0, x0), view_point(y1, x1)
        return left, top, right, bottom

    for layer, boxes in ((KEY_LAYER, layers.key), (MODEL_LAYER, layers.model)):
        for finding, box in boxes:
            box_corners = corners(box.y0, box.x0, box.y1, box.x1)
            _rectangle(draw, box_corners, layer)
            label = box.label if box.label and box.label != "finding" else shown_name(finding)
            _label(draw, font, (box_corners[0], box_corners[1]), label, layer, image.size)
    for mark in layers.student:
        if mark.is_point:
            x, y = view_point(mark.y0, mark.x0)
            colour = COLOURS[STUDENT_LAYER]
            draw.line((x - 9, y, x + 9, y), fill=colour, width=LINE_WIDTH)
            draw.line((x, y - 9, x, y + 9), fill=colour, width=LINE_WIDTH)
            draw.ellipse((x - 6, y - 6, x + 6, y + 6), outline=colour, width=2)
            _label(draw, font, (x + 8, y - 6), shown_name(mark.finding), STUDENT_LAYER, image.size)
        else:
            box_corners = corners(mark.y0, mark.x0, mark.y1, mark.x1)
            _rectangle(draw, box_corners, STUDENT_LAYER)
            _label(draw, font, (box_corners[0], box_corners[3] + 18), shown_name(mark.finding), STUDENT_LAYER,
                   image.size)  # fmt: skip
    _legend(draw, font, layers.drawn(), image.size)
    return np.asarray(image)


def _legend(draw, font, drawn: Sequence[str], size: tuple[int, int]) -> None:
    """The legend in the picture's bottom-right corner (the top-right one holds the viewer's full-screen button):
    a line sample in each drawn layer's colour and style."""
    if not drawn:
        return
    names = [LAYER_NAMES[layer] for layer in drawn]
    text_width = max(draw.textbbox((0, 0), name, font=font)[2] for name in names)
    width, line_height = text_width + 48, 20
    height = line_height * len(drawn) + 6
    left, top = size[0] - width - 6, size[1] - height - 6
    draw.rectangle((left, top, left + width, top + height), fill=(0, 0, 0))
    for index, layer in enumerate(drawn):
        y = top + 4 + index * line_height + line_height / 2
        for a, b in _segments((left + 6, y), (left + 36, y), STYLES[layer]):
            draw.line((*a, *b), fill=COLOURS[layer], width=LINE_WIDTH)
        draw.text((left + 42, y - 8), LAYER_NAMES[layer], fill=COLOURS[layer], font=font)
