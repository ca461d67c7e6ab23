"""Pointing on a case: the student's marks (a point or a box per finding claimed), the model's boxes (its answers
to "Where?"), and which overlays the viewer shows. Small immutable values kept in the session: fractions of the
film's rows and columns, never pixels, so a mark means the same at every zoom and in every export.

A finding is named as phantoms.findings.FINDINGS names it ("pleural_effusion") when the student picks it from the
list; a typed name that is none of them is kept as typed (scored as a claim the key cannot confirm).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from medgemma_xray.grounding.boxes import FilmBox
from medgemma_xray.phantoms.findings import FINDINGS

MAX_MARKS = 24  # per case: far more than the findings a film has; a runaway client cannot grow a session
MAX_NAME = 60
# The overlays a revealed case can show, in the legend's order.
KEY_LAYER, STUDENT_LAYER, MODEL_LAYER = "key", "student", "model"
LAYERS = (KEY_LAYER, STUDENT_LAYER, MODEL_LAYER)
LAYER_NAMES = {KEY_LAYER: "Key region", STUDENT_LAYER: "Your marks", MODEL_LAYER: "Model's boxes"}


def finding_name(text: str) -> str:
    """A finding as scoring names it: a FINDINGS name from its shown form ("pleural effusion") or itself; anything
    else as typed, spaces collapsed, at most MAX_NAME characters. Raises ValueError for an empty name."""
    words = " ".join(str(text or "").split())[:MAX_NAME]
    if not words:
        raise ValueError("Pick a finding from the list (or type one) first.")
    canonical = words.lower().replace(" ", "_").replace("/", "_or_")
    return canonical if canonical in FINDINGS else words


def shown_name(finding: str) -> str:
    """A finding as a person reads it: "pleural effusion", "nodule or mass"."""
    return finding.replace("_", " ") if finding in FINDINGS else finding


@dataclass(frozen=True)
class Mark:
    """One claim on the film: a point (y0 == y1 and x0 == x1) or a box, in fractions of the film (0..1)."""

    finding: str
    y0: float
    x0: float
    y1: float
    x1: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.y0 <= self.y1 <= 1.0 and 0.0 <= self.x0 <= self.x1 <= 1.0):
            raise ValueError(f"a mark lies inside the film, corners ordered; got {self}")
        if self.is_point != (self.y0 == self.y1 or self.x0 == self.x1):
            raise ValueError("a box mark needs a height and a width: click its two opposite corners apart")

    @classmethod
    def point(cls, finding: str, y: float, x: float) -> Mark:
        y, x = _clip(y), _clip(x)
        return cls(finding, y, x, y, x)

    @classmethod
    def box(cls, finding: str, first: tuple[float, float], second: tuple[float, float]) -> Mark:
        """A box from two opposite corners (y, x) in any order."""
        (ya, xa), (yb, xb) = ((_clip(y), _clip(x)) for y, x in (first, second))
        if ya == yb or xa == xb:  # else two clicks on one spot would make a point, not the box asked for
            raise ValueError("A box needs a height and a width: click its two opposite corners apart.")
        return cls(finding, min(ya, yb), min(xa, xb), max(ya, yb), max(xa, xb))

    @property
    def is_point(self) -> bool:
        return self.y0 == self.y1 and self.x0 == self.x1

    @property
    def kind(self) -> str:
        return "point" if self.is_point else "box"

    @property
    def centre(self) -> tuple[float, float]:
        return ((self.y0 + self.y1) / 2, (self.x0 + self.x1) / 2)

    def film_box(self) -> FilmBox | None:
        """The box as grounding compares boxes (None for a point)."""
        return None if self.is_point else FilmBox(shown_name(self.finding), self.y0, self.x0, self.y1, self.x1)

    def text(self) -> str:
        """e.g. "pleural effusion: box rows 55-80 %, columns 10-35 %"."""
        if self.is_point:
            return f"{shown_name(self.finding)}: point at row {self.y0:.0%}, column {self.x0:.0%}"
        return f"{shown_name(self.finding)}: box rows {self.y0:.0%}-{self.y1:.0%}, columns {self.x0:.0%}-{self.x1:.0%}"


def _clip(value: float) -> float:
    return min(max(float(value), 0.0), 1.0)


@dataclass(frozen=True)
class ModelLocation:
    """The model's answer to "Where is <finding>?": its boxes (film fractions) and a notice for the student when
    there is nothing to draw or some items were refused (never an error: a model may not locate a finding)."""

    finding: str
    boxes: tuple[FilmBox, ...] = ()
    notice: str = ""


@dataclass(frozen=True)
class Pointing:
    """A case's pointing: the student's marks, the model's locations, the overlays shown, and whether the marks
    are locked (at Reveal: the marks scored are the marks made before it)."""

    marks: tuple[Mark, ...] = ()
    model: tuple[ModelLocation, ...] = ()
    shown: frozenset[str] = field(default_factory=lambda: frozenset(LAYERS))
    locked: bool = False
    key_regions: tuple | None = None  # set at Reveal (phantoms.regions.Region); None: the key says not where
    model_asked: bool = False  # the model was asked Where? for the findings at Reveal (it can localise)

    def with_mark(self, mark: Mark) -> Pointing:
        if self.locked:
            raise ValueError("The marks are locked: this case is revealed. Open the next case to mark again.")
        if len(self.marks) >= MAX_MARKS:
            raise ValueError(f"At most {MAX_MARKS} marks on one case: remove one first.")
        return replace(self, marks=(*self.marks, mark))

    def without_mark(self, index: int) -> Pointing:
        if self.locked:
            raise ValueError("The marks are locked: this case is revealed.")
        if not 0 <= index < len(self.marks):
            raise ValueError("That mark is no longer there; pick one from the list.")
        return replace(self, marks=self.marks[:index] + self.marks[index + 1 :])

    def with_location(self, location: ModelLocation) -> Pointing:
        """The model's latest answer for this finding replaces an earlier one."""
        kept = tuple(loc for loc in self.model if loc.finding != location.finding)
        return replace(self, model=(*kept, location))

    def model_boxes(self) -> tuple[tuple[str, FilmBox], ...]:
        return tuple((loc.finding, box) for loc in self.model for box in loc.boxes)
