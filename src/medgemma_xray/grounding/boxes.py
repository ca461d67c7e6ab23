"""Boxes on a film: MedGemma 1.5's `box_2d` format parsed and validated, converted between the model's frame and
the film's, and compared (IoU).

The format, from Google-Health/medgemma's `cxr_anatomy_localization_with_hugging_face.ipynb`: the answer ends with
`Final Answer: ` and a JSON list of objects, each `{"box_2d": [y0, x0, y1, x1], "label": "..."}`, optionally inside
```json ... ``` fences, coordinates normalised to 0..1000 on the image the model saw. Here that image is the film
zero-padded to a centred square (xray_io.preprocess.pad_to_square, as the notebook's pad_image_to_square), so a box
is mapped back to the film by removing the padding. A box that is not inside the film or whose corners are not
ordered is refused with the reason, never drawn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MODEL_SCALE = 1000  # box_2d coordinates are integers in 0..1000 of the (square) model image


class BoxFormatError(ValueError):
    """The model's answer holds no parseable box list; the message says what was found."""


@dataclass(frozen=True)
class FilmBox:
    """A labelled box in the film's frame: fractions (0..1) of the film's rows (y) and columns (x), y0 < y1, x0 < x1."""

    label: str
    y0: float
    x0: float
    y1: float
    x1: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.y0 < self.y1 <= 1.0 and 0.0 <= self.x0 < self.x1 <= 1.0):
            raise ValueError(
                f"a box needs 0 <= y0 < y1 <= 1 and 0 <= x0 < x1 <= 1 (fractions of the film); got "
                f"y0={self.y0}, x0={self.x0}, y1={self.y1}, x1={self.x1}"
            )

    @property
    def area(self) -> float:
        return (self.y1 - self.y0) * (self.x1 - self.x0)

    @property
    def centre(self) -> tuple[float, float]:
        """(y, x) of the box's centre, in film fractions."""
        return ((self.y0 + self.y1) / 2, (self.x0 + self.x1) / 2)

    def pixels(self, rows: int, cols: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) in pixels of a film of rows x cols, as Pillow's ImageDraw takes them."""
        return (round(self.x0 * cols), round(self.y0 * rows), round(self.x1 * cols), round(self.y1 * rows))


@dataclass(frozen=True)
class ParsedBoxes:
    """What one answer located: the boxes that passed, and a reason for each item that did not."""

    boxes: tuple[FilmBox, ...]
    refused: tuple[str, ...]


def iou(a: FilmBox, b: FilmBox) -> float:
    """Intersection over union of two boxes in the same film (0 when they do not overlap)."""
    inter_h = min(a.y1, b.y1) - max(a.y0, b.y0)
    inter_w = min(a.x1, b.x1) - max(a.x0, b.x0)
    if inter_h <= 0 or inter_w <= 0:
        return 0.0
    inter = inter_h * inter_w
    return inter / (a.area + b.area - inter)


def _padding(rows: int, cols: int) -> tuple[int, int, int]:
    """(side, top, left) of xray_io.preprocess.pad_to_square for a film of rows x cols."""
    side = max(rows, cols)
    return side, (side - rows) // 2, (side - cols) // 2


def to_model(box: FilmBox, rows: int, cols: int) -> list[int]:
    """The box as the model writes it: [y0, x0, y1, x1] in 0..1000 of the centred square."""
    side, top, left = _padding(rows, cols)
    scale = MODEL_SCALE / side
    return [
        round((top + box.y0 * rows) * scale),
        round((left + box.x0 * cols) * scale),
        round((top + box.y1 * rows) * scale),
        round((left + box.x1 * cols) * scale),
    ]


def from_model(label: str, box_2d: list[float], rows: int, cols: int) -> FilmBox:
    """A model box ([y0, x0, y1, x1], 0..1000 of the centred square) in the film's frame.

    Raises ValueError naming the fault: not four numbers, outside 0..1000, corners not ordered, or wholly in the
    padding. A box that reaches into the padding is clipped to the film (the model cannot see where the film
    ends exactly at 896 px); one with no part on the film is refused.
    """
    if not isinstance(box_2d, (list, tuple)) or len(box_2d) != 4:
        raise ValueError(f"box_2d must be four numbers [y0, x0, y1, x1]; got {box_2d!r:.80}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box_2d):
        raise ValueError(f"box_2d must be four numbers [y0, x0, y1, x1]; got {box_2d!r:.80}")
    y0, x0, y1, x1 = (float(v) for v in box_2d)
    if not all(0.0 <= v <= MODEL_SCALE for v in (y0, x0, y1, x1)):
        raise ValueError(f"box_2d coordinates must lie in 0..{MODEL_SCALE}; got {box_2d!r:.80}")
    if not (y0 < y1 and x0 < x1):
        raise ValueError(f"box_2d must have y0 < y1 and x0 < x1 (top-left, then bottom-right); got {box_2d!r:.80}")
    side, top, left = _padding(rows, cols)
    scale = side / MODEL_SCALE
    fy0, fy1 = ((y0 * scale - top) / rows, (y1 * scale - top) / rows)
    fx0, fx1 = ((x0 * scale - left) / cols, (x1 * scale - left) / cols)
    cy0, cy1, cx0, cx1 = (min(max(v, 0.0), 1.0) for v in (fy0, fy1, fx0, fx1))
    if not (cy0 < cy1 and cx0 < cx1):
        raise ValueError(f"box_2d {box_2d!r:.80} lies wholly in the padding around the film")
    return FilmBox(label=label, y0=cy0, x0=cx0, y1=cy1, x1=cx1)


_FINAL = re.compile(r"Final Answer:\s*", re.IGNORECASE)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)


def _json_list(text: str) -> list:
    """The JSON list after the last 'Final Answer:' (or, failing that, in the last ```json fence)."""
    tail = _FINAL.split(text)[-1] if _FINAL.search(text) else text
    fenced = _FENCE.findall(tail)
    candidate = fenced[-1] if fenced else tail
    start, end = candidate.find("["), candidate.rfind("]")
    if start < 0 or end <= start:
        raise BoxFormatError("the answer has no JSON list of boxes (expected 'Final Answer: [{\"box_2d\": ...}]')")
    try:
        value = json.loads(candidate[start : end + 1])
    except (ValueError, RecursionError) as error:
        raise BoxFormatError(f"the answer's box list is not valid JSON ({type(error).__name__})") from None
    if not isinstance(value, list):
        raise BoxFormatError("the answer's box list is not a JSON list")
    return value


def parse_boxes(text: str, rows: int, cols: int, max_boxes: int = 16) -> ParsedBoxes:
    """Every valid box in a model answer, in the film's frame; a reason for each item refused.

    Raises BoxFormatError when the answer holds no box list at all (the caller shows 'the model did not
    locate it'); an empty list is a valid answer (nothing to point at).
    """
    items = _json_list(text)
    boxes: list[FilmBox] = []
    refused: list[str] = []
    for index, item in enumerate(items[:max_boxes]):
        if not isinstance(item, dict) or "box_2d" not in item:
            refused.append(f"item {index + 1}: not an object with a box_2d")
            continue
        label = item.get("label")
        label = label.strip()[:80] if isinstance(label, str) and label.strip() else "finding"
        try:
            boxes.append(from_model(label, item["box_2d"], rows, cols))
        except ValueError as error:
            refused.append(f"item {index + 1}: {error}")
    if len(items) > max_boxes:
        refused.append(f"{len(items) - max_boxes} more boxes than the {max_boxes} drawn were left out")
    return ParsedBoxes(boxes=tuple(boxes), refused=tuple(refused))


def final_answer(boxes: list[tuple[str, list[int]]]) -> str:
    """The 'Final Answer: [...]' line for boxes already in the model's frame (what the demo model learns)."""
    return "Final Answer: " + json.dumps([{"box_2d": box, "label": label} for label, box in boxes])
