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
import datetime
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from medgemma_xray.assistant.spreadsheet import text_cell, valid_text
from medgemma_xray.phantoms.findings import PhantomLabels
from medgemma_xray.teaching.change_export import CHANGE_COLUMNS, change_cells, change_flowables
from medgemma_xray.teaching.marks import Pointing
from medgemma_xray.teaching.scoring import READ_FIELDS, FieldMark, Score, mark_text, score_read, shown

REMOVED = "[removed]"
# The CSV: the round's facts, then for every scored field its key, the student's cell and the model's cell (one
# column each, so a spreadsheet can sort and count them), then the free text.
CSV_LEAD = ("date", "student", "case", "title", "history", "student_score", "model_score", "asked_before_reveal")
CSV_TAIL = ("student_notes", "questions_and_answers")
# Pointing (teaching.pointing_report): the marks exactly (film fractions), and each reader's per-finding score.
POINTING_COLUMNS = ("student_marks", "model_boxes", "student_pointing_score", "model_pointing_score")


def field_columns() -> tuple[str, ...]:
    """Three columns per scored field, e.g. "effusion side (key)", "... (student)", "... (model)"."""
    return tuple(f"{label} ({who})" for _, label in READ_FIELDS.values() for who in ("key", "student", "model"))


def csv_columns() -> tuple[str, ...]:
    return (*CSV_LEAD, *field_columns(), *POINTING_COLUMNS, *CHANGE_COLUMNS, *CSV_TAIL)


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
    asked_before_reveal: int = 0  # questions asked before the reveal (quiz off, or a teacher allowed it)
    thumbnail: bytes = b""  # a small PNG of the film at its own window, for the handout
    pointing: Pointing = field(default_factory=Pointing)  # the student's marks and the model's boxes
    regions: tuple | None = None  # the key's regions (phantoms.regions.Region); None: the key says not where
    change_key: dict[str, str] | None = None  # a case with a prior: the pair's changes (finding -> kind)
    change_read: dict[str, str] | None = None  # the student's "what changed" read
    change_statement: str = ""  # the model's answer to "what changed?"

    @property
    def student_score(self) -> Score | None:
        """Scored on the fields the student answered; the rest are "not assessed"."""
        if self.key is None or self.student_read is None:
            return None
        return score_read(self.student_read, self.key, answered_only=True)

    @property
    def model_score(self) -> Score | None:
        return score_read(self.model_read, self.key) if self.key is not None and self.model_read is not None else None

    @property
    def pointing_scores(self):
        """The marks scored per finding (teaching.pointing_report); None without a key or without any mark."""
        from medgemma_xray.teaching.pointing_report import score_pointing

        pointing = self.pointing
        if self.key is None or not (pointing.marks or pointing.model or pointing.model_asked):
            return None
        return score_pointing(pointing, self.key, pointing.model_asked)


@dataclass(frozen=True)
class SessionInfo:
    """Who and when, printed on every export: the student's name as typed (optional; never logged) and the day."""

    student: str = ""
    day: datetime.date = field(default_factory=datetime.date.today)
    first_case: int = 1  # the number of the first record exported (later than 1 once a long session let some go)

    @property
    def student_shown(self) -> str:
        return " ".join(self.student.split())[:80]


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


def _field_cells(record: CaseRecord) -> dict[str, str]:
    """The per-field columns of one case: empty where the key does not score the field (or there is no key)."""
    cells = dict.fromkeys(field_columns(), "")
    student, model = record.student_score, record.model_score
    for mark in _scored_marks(student, model):
        cells[f"{mark.label} (key)"] = shown(mark.key)
        if student is not None:
            cells[f"{mark.label} (student)"] = mark_text(student.mark(mark.field), "WRONG")
        if model is not None:
            cells[f"{mark.label} (model)"] = mark_text(model.mark(mark.field), "WRONG")
    return cells


def _score_text(score: Score | None) -> str:
    if score is None:
        return ""
    if not score.total:
        return score.summary()
    return f"{score.summary()} ({score.fraction:.0%})"


def scrub(text: str, forbidden: Iterable[str]) -> str:
    """text with every forbidden string (case-insensitive; DICOM's ^ and a file name's _ count as spaces) removed,
    and any lone surrogate replaced (U+FFFD), so the text can be written as UTF-8."""
    text = valid_text(text)
    for value in sorted({v.strip() for v in forbidden if v and len(v.strip()) >= 3}, key=len, reverse=True):
        parts = [re.escape(p) for p in re.split(r"[\s^_]+", value) if p]
        pattern = r"[\s^_]+".join(parts)
        text = re.sub(pattern, REMOVED, text, flags=re.IGNORECASE)
    return text


def csv_rows(
    records: list[CaseRecord], forbidden: Iterable[str] = (), info: SessionInfo | None = None
) -> list[dict[str, str]]:
    forbidden = list(forbidden)
    info = info or SessionInfo()
    rows = []
    for number, record in enumerate(records, start=info.first_case):
        row = {
            "date": info.day.isoformat(),
            "student": info.student_shown,
            "case": str(number),
            "title": record.title,
            "history": record.history,
            "student_score": _score_text(record.student_score) if record.key is not None else "(no key)",
            "model_score": _score_text(record.model_score) if record.key is not None else "(no key)",
            "asked_before_reveal": str(record.asked_before_reveal),
            **_field_cells(record),
            **_pointing_cells(record),
            **change_cells(record.change_key, record.change_read, record.change_statement),
            "student_notes": record.student_notes,
            "questions_and_answers": " || ".join(f"Q: {q} A: {a}" for q, a in record.questions),
        }
        rows.append({key: text_cell(scrub(value, forbidden)) for key, value in row.items()})
    return rows


def _pointing_cells(record: CaseRecord) -> dict[str, str]:
    from medgemma_xray.teaching.pointing_report import marks_cell, model_marks

    scores = record.pointing_scores
    return {
        "student_marks": marks_cell(record.pointing.marks),
        "model_boxes": marks_cell(model_marks(record.pointing)),
        "student_pointing_score": scores.student_summary() if scores is not None else "",
        "model_pointing_score": scores.model_summary() if scores is not None else "",
    }


def session_csv(records: list[CaseRecord], forbidden: Iterable[str] = (), info: SessionInfo | None = None) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=csv_columns())
    writer.writeheader()
    writer.writerows(csv_rows(records, forbidden, info))
    return buffer.getvalue()


def _marks_table(record: CaseRecord, para, mm, colors):
    from reportlab.platypus import Table, TableStyle

    student, model = record.student_score, record.model_score
    rows = [[para("Field"), para("Key"), para("Student"), para("Model")]]
    for mark in _scored_marks(student, model):
        s = student.mark(mark.field) if student else None
        m = model.mark(mark.field) if model else None
        rows.append([para(mark.label), para(shown(mark.key)), para(mark_text(s, "WRONG")), para(mark_text(m, "WRONG"))])
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
    return table


def _pointing_section(record: CaseRecord, para, mm, colors) -> list:
    """The marks (exact fractions) and, with a key, the per-finding pointing table (finding, criterion, key,
    student, model) and the tolerances it was scored with."""
    from reportlab.platypus import Spacer, Table, TableStyle

    from medgemma_xray.teaching.mark_scoring import TOLERANCES_TEXT
    from medgemma_xray.teaching.pointing_report import marks_cell, model_marks

    pointing = record.pointing
    story: list = []
    if pointing.marks:
        story.append(para(f"Student's marks: {marks_cell(pointing.marks)}"))
    if pointing.model:
        story.append(para(f"Model's boxes: {marks_cell(model_marks(pointing)) or 'none located'}"))
    scores = record.pointing_scores
    if scores is None:
        return story
    rows = [[para(h) for h in ("Finding", "Criterion", "Key", "Student", "Model")]]
    rows += [[para(cell) for cell in row] for row in scores.rows()]
    table = Table(rows, colWidths=[32 * mm, 20 * mm, 38 * mm, 40 * mm, 40 * mm], repeatRows=1)
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
    summary = f"Pointing: student {scores.student_summary()}; model {scores.model_summary()}."
    return [*story, Spacer(1, 2 * mm), para(summary), table, para(TOLERANCES_TEXT)]


def _case_head(record: CaseRecord, number: int, para, styles, mm):
    """The case's heading, thumbnail, history and scores: one block that the page never splits."""
    from reportlab.platypus import Image, Table

    text = [
        para(f"Case {number}: {record.title}", styles["Heading2"]),
        para(f"History: {record.history or '-'}"),
    ]
    if record.key is None:
        text.append(para("No answer key for this case."))
    else:
        scores = f"Student {_score_text(record.student_score) or '-'}; Model {_score_text(record.model_score) or '-'}"
        text.append(para(f"Score: {scores}"))
    if record.asked_before_reveal:
        text.append(para(f"Asked {record.asked_before_reveal} question(s) before the reveal."))
    if not record.thumbnail:
        return text
    picture = Image(io.BytesIO(record.thumbnail))
    side = 32 * mm
    ratio = picture.imageWidth / max(picture.imageHeight, 1)
    picture.drawWidth, picture.drawHeight = (side, side / ratio) if ratio >= 1 else (side * ratio, side)
    layout = Table([[picture, text]], colWidths=[36 * mm, 134 * mm])
    layout.setStyle([("VALIGN", (0, 0), (-1, -1), "TOP"), ("LEFTPADDING", (0, 0), (0, 0), 0)])
    return [layout]


def session_pdf(
    records: list[CaseRecord],
    forbidden: Iterable[str] = (),
    title: str = "Teaching round",
    info: SessionInfo | None = None,
) -> bytes:
    """A printable handout (A4): a header with the date and the student; per case its heading, film thumbnail,
    history and scores kept together with the marks table (key, student, model), then the teaching points and
    the questions asked. Every page's foot repeats the date, the student and the page number."""
    from xml.sax.saxutils import escape

    from reportlab.lib import colors
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.lib.units import mm
    from reportlab.platypus import KeepTogether, Paragraph, SimpleDocTemplate, Spacer

    forbidden = list(forbidden)
    info = info or SessionInfo()
    styles = getSampleStyleSheet()
    small = styles["BodyText"].clone("small", fontSize=8, leading=10)

    def para(text: str, style=small) -> Paragraph:
        return Paragraph(escape(scrub(text, forbidden)), style)

    who = f"Student: {info.student_shown}" if info.student_shown else "Student: (not given)"
    byline = f"{info.day.isoformat()} · {who} · {len(records)} case(s)"
    if info.first_case > 1:
        byline += (
            f" (cases {info.first_case}-{info.first_case + len(records) - 1}: a session keeps its last {len(records)})"
        )
    story = [
        Paragraph(escape(title), styles["Title"]),
        para(byline, styles["Heading4"]),
        para("For education and research only. Not a medical device, not for diagnosis.", styles["Italic"]),
        Spacer(1, 4 * mm),
    ]
    for number, record in enumerate(records, start=info.first_case):
        block = _case_head(record, number, para, styles, mm)
        if record.key is not None:
            block += [Spacer(1, 2 * mm), _marks_table(record, para, mm, colors)]
        story.append(KeepTogether(block))
        story += _pointing_section(record, para, mm, colors)
        story += change_flowables(record.change_key, record.change_read, record.change_statement, para, mm, colors)
        if record.student_notes:
            story.append(para(f"Student's notes: {record.student_notes}"))
        for point in record.teaching_points:
            story.append(para(f"Teaching point: {point}"))
        for question, answer in record.questions:
            story.append(para(f"Q: {question}  A: {answer}"))
        story.append(Spacer(1, 5 * mm))
    foot = scrub(f"{title} · {byline}", forbidden)

    def footer(canvas, document) -> None:
        canvas.saveState()
        canvas.setFont("Helvetica", 7)
        canvas.drawString(15 * mm, 8 * mm, foot)
        canvas.drawRightString(A4[0] - 15 * mm, 8 * mm, f"page {document.page}")
        canvas.restoreState()

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
    document.build(story, onFirstPage=footer, onLaterPages=footer)
    return buffer.getvalue()
