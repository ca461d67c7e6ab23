"""A case's pointing, scored and put in words: one table of rows (finding, criterion, key, student, model) that the
page (Markdown), the session CSV and the PDF handout all show, and the marks as cells.
"""

from __future__ import annotations

from dataclasses import dataclass

from medgemma_xray.phantoms.findings import PhantomLabels
from medgemma_xray.teaching.mark_scoring import Check, FindingMarkScore, score_marks, summary
from medgemma_xray.teaching.marks import Mark, Pointing, shown_name

CRITERIA = ("presence", "side", "zone", "overlap")


def model_marks(pointing: Pointing) -> tuple[Mark, ...]:
    """The model's boxes as marks of the finding it was asked about."""
    return tuple(
        Mark.box(location.finding, (box.y0, box.x0), (box.y1, box.x1))
        for location in pointing.model
        for box in location.boxes
    )


@dataclass(frozen=True)
class PointingScores:
    student: tuple[FindingMarkScore, ...]
    model: tuple[FindingMarkScore, ...] | None  # None: the model was not asked (no localisation)

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(finding, criterion, key, student, model) for every finding either scored, criteria in CRITERIA order;
        presence always, the other criteria where either reader is scored on them."""
        by_student = {s.finding: s for s in self.student}
        by_model = {s.finding: s for s in self.model or ()}
        names = list(by_student) + [name for name in by_model if name not in by_student]
        rows = []
        for name in names:
            student, model = by_student.get(name), by_model.get(name)
            for criterion in CRITERIA:
                checks = [getattr(reader, criterion) for reader in (student, model) if reader is not None]
                if criterion != "presence" and all(check.right is None for check in checks):
                    continue
                own = getattr(student or model, criterion)
                rows.append(
                    (
                        shown_name(name),
                        criterion,
                        own.key,
                        check_text(getattr(student, criterion) if student else None),
                        check_text(getattr(model, criterion) if model else None) if self.model is not None else "-",
                    )
                )
        return rows

    def student_summary(self) -> str:
        return summary(self.student)

    def model_summary(self) -> str:
        return summary(self.model) if self.model is not None else "not asked (this checkpoint does not localise)"


def check_text(check: Check | None) -> str:
    """A reader's cell: "claimed (right)", "hit (IoU 0.41) (wrong)", "-" when that reader has no such finding."""
    if check is None:
        return "-"
    if check.right is None:
        return check.marked or "not scored"
    return f"{check.marked} ({'right' if check.right else 'wrong'})"


def score_pointing(pointing: Pointing, key: PhantomLabels, model_asked: bool) -> PointingScores:
    regions = pointing.key_regions
    student = score_marks(pointing.marks, key, regions)
    model = score_marks(model_marks(pointing), key, regions) if model_asked else None
    return PointingScores(student, model)


def marks_cell(marks: tuple[Mark, ...]) -> str:
    """Marks in one cell, exact: "pleural effusion box y0=0.550 x0=0.100 y1=0.800 x1=0.350 | pacemaker point ..."."""
    parts = []
    for mark in marks:
        if mark.is_point:
            parts.append(f"{shown_name(mark.finding)} point y={mark.y0:.3f} x={mark.x0:.3f}")
        else:
            parts.append(
                f"{shown_name(mark.finding)} box y0={mark.y0:.3f} x0={mark.x0:.3f} y1={mark.y1:.3f} x1={mark.x1:.3f}"
            )
    return " | ".join(parts)
