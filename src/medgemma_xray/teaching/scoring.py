"""Field-by-field scoring of a read (a student's or the model's) against an answer key, exactly and reproducibly.

A read is a flat mapping from READ_FIELDS names to values; None (or a missing name) means "not stated". A key is
PhantomLabels (medgemma_xray.phantoms.findings), from a phantom's sidecar or a teacher's key file (medgemma_xray.teaching.keys).

Which fields count:
- every finding's presence (8 fields), the cardiothoracic ratio and the three technique fields, always;
- a finding's attributes (side, size, lobe, tip, ...) only where the key has that finding; a read that misses the
  finding gets them wrong too ("not stated"). Where the key has no such finding they are not scored.

A student's read is scored on what the student answered (answered_only): a field left empty is "not assessed",
shown as such and left out of the score, so an empty read scores nothing rather than the absent findings of a
normal film. The model's read is scored on every field: what its report does not state is wrong.

Numbers match within a stated tolerance (the attributes a model is known to get wrong: a ratio of 0.39 read
"about 0.55", a 2.5 cm nodule read "3 cm"); categories must be equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import SupportsFloat, cast

from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels

CTR_TOLERANCE = 0.03  # a ratio measured with a calliper; the demo model reads it to the nearest 0.05
NODULE_SIZE_TOLERANCE_CM = 0.3
TUBE_TIP_TOLERANCE_CM = 1.0

# name -> (finding it belongs to or None, how it is shown)
READ_FIELDS: dict[str, tuple[str | None, str]] = {
    **{f"present.{finding}": (None, finding.replace("_", " ")) for finding in FINDINGS},
    "cardiothoracic_ratio": (None, "cardiothoracic ratio"),
    "technique.rotated": (None, "rotated"),
    "technique.inspiration": (None, "inspiration"),
    "technique.exposure": (None, "exposure"),
    "effusion.side": ("pleural_effusion", "effusion side"),
    "effusion.size": ("pleural_effusion", "effusion size"),
    "pneumothorax.side": ("pneumothorax", "pneumothorax side"),
    "pneumothorax.size": ("pneumothorax", "pneumothorax size"),
    "nodule.lobe": ("nodule_or_mass", "nodule/mass lobe"),
    "nodule.size_cm": ("nodule_or_mass", "nodule/mass size (cm)"),
    "consolidation.lobe": ("consolidation", "consolidation lobe"),
    "endotracheal_tube.tip_above_carina_cm": ("endotracheal_tube", "ET tube tip above carina (cm)"),
    "central_line.route": ("central_line", "central line route"),
    "central_line.tip": ("central_line", "central line tip"),
    "pacemaker.side": ("pacemaker", "pacemaker side"),
}
TOLERANCES = {
    "cardiothoracic_ratio": CTR_TOLERANCE,
    "nodule.size_cm": NODULE_SIZE_TOLERANCE_CM,
    "endotracheal_tube.tip_above_carina_cm": TUBE_TIP_TOLERANCE_CM,
}


def read_from_labels(labels: PhantomLabels) -> dict[str, object]:
    """The read that states exactly what the labels say (the key as a read: it scores 100%)."""
    read: dict[str, object] = {f"present.{finding}": labels.present(finding) for finding in FINDINGS}
    read["cardiothoracic_ratio"] = labels.heart.cardiothoracic_ratio
    read["technique.rotated"] = labels.technique.rotated
    read["technique.inspiration"] = labels.technique.inspiration
    read["technique.exposure"] = labels.technique.exposure
    for name, (finding, _) in READ_FIELDS.items():
        if finding is None:
            continue
        obj_name, attribute = name.split(".", 1)
        obj = getattr(labels, obj_name)
        if obj is not None:
            read[name] = getattr(obj, attribute)
    return read


@dataclass(frozen=True)
class FieldMark:
    field: str
    label: str
    key: object
    read: object
    right: bool
    assessed: bool = True  # False: the reader left the field empty (answered_only scoring); not in the score


@dataclass(frozen=True)
class Score:
    marks: tuple[FieldMark, ...]

    @property
    def right(self) -> int:
        return sum(mark.right for mark in self.marks if mark.assessed)

    @property
    def total(self) -> int:
        return sum(mark.assessed for mark in self.marks)

    @property
    def not_assessed(self) -> int:
        return sum(not mark.assessed for mark in self.marks)

    @property
    def fraction(self) -> float:
        return self.right / self.total if self.total else 0.0

    def summary(self) -> str:
        """e.g. "7/9" or "7/9 (14 not assessed)"; "nothing answered" when every field was left empty."""
        if not self.total:
            return f"nothing answered ({self.not_assessed} not assessed)"
        return f"{self.right}/{self.total}" + (f" ({self.not_assessed} not assessed)" if self.not_assessed else "")

    def mark(self, field: str) -> FieldMark | None:
        return next((m for m in self.marks if m.field == field), None)


def _matches(field: str, key_value: object, read_value: object) -> bool:
    if read_value is None:
        return False
    if field in TOLERANCES:
        try:
            # float() of anything else raises TypeError, caught below
            return (
                abs(float(cast(SupportsFloat, read_value)) - float(cast(SupportsFloat, key_value)))
                <= TOLERANCES[field] + 1e-9
            )
        except (TypeError, ValueError):
            return False
    return read_value == key_value


def score_read(read: Mapping[str, object], key: PhantomLabels, answered_only: bool = False) -> Score:
    """Mark every scored field of `read` against `key` (see the module docstring for which fields count).
    answered_only: a field the read leaves empty is marked not assessed and left out of the score (a student's
    read); otherwise it is wrong ("not stated", the model's read)."""
    unknown = sorted(set(read) - set(READ_FIELDS))
    if unknown:
        raise ValueError(f"unknown read fields {unknown}; the fields are {', '.join(READ_FIELDS)}")
    truth = read_from_labels(key)
    marks = []
    for name, (finding, label) in READ_FIELDS.items():
        if finding is not None and not key.present(finding):
            continue  # the key has no such finding: its attributes are not scored
        value = read.get(name)
        assessed = value is not None or not answered_only
        marks.append(FieldMark(name, label, truth.get(name), value, _matches(name, truth.get(name), value), assessed))
    return Score(tuple(marks))


def mark_text(mark: FieldMark | None, wrong: str = "wrong") -> str:
    """A reader's cell in a marks table: "yes (right)", "no (wrong)", "not assessed", or "-" (no read)."""
    if mark is None:
        return "-"
    if not mark.assessed:
        return "not assessed"
    return f"{shown(mark.read)} ({'right' if mark.right else wrong})"


def shown(value: object) -> str:
    """A read or key value as a person reads it."""
    if value is None:
        return "not stated"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
