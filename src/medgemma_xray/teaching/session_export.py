"""A teaching session the teacher keeps: every case with the student's read, the model's read, the key, the
scores and the questions asked, as CSV (one row per case) and a printable PDF handout (reportlab).

Nothing identifying leaves here. Cases are named by their library title or "Uploaded film N", never by a file
name, and carry no DICOM attribute. As a second guard, every export is scrubbed of the session's `forbidden`
strings (the uploaded files' names and stems, the source films' patient and study attributes): a student who
types a patient's name into a free-text box does not put it into the handout either. CSV cells are neutralised
against formula injection (assistant.spreadsheet), and lone surrogates become U+FFFD in every export.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from medgemma_xray.assistant.spreadsheet import text_cell, valid_text
from medgemma_xray.phantoms.findings import PhantomLabels
from medgemma_xray.teaching.scoring import READ_FIELDS, FieldMark, Score, read_from_labels, score_read, shown

REMOVED = "[removed]"
CSV_COLUMNS = (
    "case",
    "title",
    "history",
    "student_read",
    "student_notes",
    "model_read",
    "key",
    "student_score",
    "model_score",
    "marks",
    "questions_and_answers",
)


@dataclass(frozen=True)
class CaseRecord:
    """One case of a session, as it stood when the answer was revealed."""

    title: str
    history: str = ""
    student_read: dict | None = None  # None: no read was entered (not a quiz)
    student_notes: str = ""
    model_read: dict | None = None
    model_report: str = ""
    key: PhantomLabels | None = None
    questions: tuple[tuple[str, str], ...] = field(default=())
    teaching_points: tuple[str, ...] = field(default=())

    @property
    def student_score(self) -> Score | None:
        return (
            score_read(self.student_read, self.key) if self.key is not None and self.student_read is not None else None
        )

    @property
    def model_score(self) -> Score | None:
        return score_read(self.model_read, self.key) if self.key is not None and self.model_read is not None else None


def read_summary(read: dict | None) -> str:
    """A read in one line: the findings called present, then their attributes and the ratio."""
    if read is None:
        return "(no read)"
    present = [
        name.split(".", 1)[1].replace("_", " ")
        for name in READ_FIELDS
        if name.startswith("present.") and read.get(name)
    ]
    details = [
        f"{label} {shown(read[name])}"
        for name, (finding, label) in READ_FIELDS.items()
        if not name.startswith("present.") and read.get(name) is not None
    ]
    return "; ".join(["findings: " + (", ".join(present) or "none")] + details)


def _scored_marks(student: Score | None, model: Score | None) -> tuple[FieldMark, ...]:
    """The key's fields as scored: the model's marks, else the student's (both score every field of one key)."""
    scored = model or student
    return scored.marks if scored is not None else ()


def _marks(record: CaseRecord) -> str:
    if record.key is None:
        return "no key"
    student, model = record.student_score, record.model_score
    parts = []
    for mark in _scored_marks(student, model):
        cells = [f"key {shown(mark.key)}"]
        s = student.mark(mark.field) if student is not None else None
        if s is not None:
            cells.append(f"student {shown(s.read)} {'right' if s.right else 'WRONG'}")
        m = model.mark(mark.field) if model is not None else None
        if m is not None:
            cells.append(f"model {shown(m.read)} {'right' if m.right else 'WRONG'}")
        parts.append(f"{mark.label}: " + ", ".join(cells))
    return " | ".join(parts)


def _score_text(score: Score | None) -> str:
    return "" if score is None else f"{score.right}/{score.total} ({score.fraction:.0%})"


def scrub(text: str, forbidden: Iterable[str]) -> str:
    """text with every forbidden string (case-insensitive; DICOM's ^ and a file name's _ count as spaces) removed,
    and any lone surrogate replaced (U+FFFD), so the text can be written as UTF-8."""
    text = valid_text(text)
    for value in sorted({v.strip() for v in forbidden if v and len(v.strip()) >= 3}, key=len, reverse=True):
        parts = [re.escape(p) for p in re.split(r"[\s^_]+", value) if p]
        pattern = r"[\s^_]+".join(parts)
        text = re.sub(pattern, REMOVED, text, flags=re.IGNORECASE)
    return text


def csv_rows(records: list[CaseRecord], forbidden: Iterable[str] = ()) -> list[dict[str, str]]:
    forbidden = list(forbidden)
    rows = []
    for number, record in enumerate(records, start=1):
        row = {
            "case": str(number),
            "title": record.title,
            "history": record.history,
            "student_read": read_summary(record.student_read),
            "student_notes": record.student_notes,
            "model_read": read_summary(record.model_read),
            "key": read_summary(read_from_labels(record.key)) if record.key is not None else "(no key)",
            "student_score": _score_text(record.student_score),
            "model_score": _score_text(record.model_score),
            "marks": _marks(record),
            "questions_and_answers": " || ".join(f"Q: {q} A: {a}" for q, a in record.questions),
        }
        rows.append({key: text_cell(scrub(value, forbidden)) for key, value in row.items()})
    return rows


def session_csv(records: list[CaseRecord], forbidden: Iterable[str] = ()) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows(csv_rows(records, forbidden))
    return buffer.getvalue()


def session_pdf(records: list[CaseRecord], forbidden: Iterable[str] = (), title: str = "Teaching round") -> bytes:
    """A printable handout (A4): per case the history, the marks table (key, student, model), the scores, the
    teaching points and the questions asked."""
    from xml.sax.saxutils import escape

    from reportlab.lib import colors
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.lib.units import mm
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

    forbidden = list(forbidden)
    styles = getSampleStyleSheet()
    small = styles["BodyText"].clone("small", fontSize=8, leading=10)

    def para(text: str, style=small) -> Paragraph:
        return Paragraph(escape(scrub(text, forbidden)), style)

    story = [
        Paragraph(escape(title), styles["Title"]),
        para("For education and research only. Not a medical device, not for diagnosis.", styles["Italic"]),
        Spacer(1, 4 * mm),
    ]
    for number, record in enumerate(records, start=1):
        story.append(para(f"Case {number}: {record.title}", styles["Heading2"]))
        story.append(para(f"History: {record.history or '-'}"))
        scores = [
            f"Student {_score_text(record.student_score) or '-'}",
            f"Model {_score_text(record.model_score) or '-'}",
        ]
        story.append(para("Score: " + "; ".join(scores) if record.key is not None else "No answer key for this case."))
        if record.key is not None:
            header = ["Field", "Key", "Student", "Model"]
            rows = [header]
            student, model = record.student_score, record.model_score
            for mark in _scored_marks(student, model):
                s = student.mark(mark.field) if student else None
                m = model.mark(mark.field) if model else None
                rows.append(
                    [
                        para(mark.label),
                        para(shown(mark.key)),
                        para("-" if s is None else f"{shown(s.read)} ({'right' if s.right else 'WRONG'})"),
                        para("-" if m is None else f"{shown(m.read)} ({'right' if m.right else 'WRONG'})"),
                    ]
                )
            table = Table(rows, colWidths=[45 * mm, 35 * mm, 45 * mm, 45 * mm], repeatRows=1)
            table.setStyle(
                TableStyle(
                    [
                        ("FONTSIZE", (0, 0), (-1, -1), 8),
                        ("BACKGROUND", (0, 0), (-1, 0), colors.lightgrey),
                        ("GRID", (0, 0), (-1, -1), 0.25, colors.grey),
                        ("VALIGN", (0, 0), (-1, -1), "TOP"),
                    ]
                )
            )
            story += [Spacer(1, 2 * mm), table]
        if record.student_notes:
            story.append(para(f"Student's notes: {record.student_notes}"))
        for point in record.teaching_points:
            story.append(para(f"Teaching point: {point}"))
        for question, answer in record.questions:
            story.append(para(f"Q: {question}  A: {answer}"))
        story.append(Spacer(1, 5 * mm))
    buffer = io.BytesIO()
    document = SimpleDocTemplate(
        buffer,
        pagesize=A4,
        leftMargin=15 * mm,
        rightMargin=15 * mm,
        topMargin=15 * mm,
        bottomMargin=15 * mm,
        title=title,
        author="MedGemma X-Ray assistant",
        invariant=1,
    )
    document.build(story)
    return buffer.getvalue()
