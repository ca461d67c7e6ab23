"""/teaching's "what changed" quiz and spaced repetition: the student's change read (committed with the read at
Reveal), its score beside the model's statement, each missed finding remembered for the student
(teaching/practice.py, one local file), and "Practise my misses", which orders a round of library cases that show
the student's due findings.

The practice file is <LOG_DIR>/teaching-practice.json; the teacher deletes it to forget every student's misses.
A file that cannot be used is named in a notice: the reveal and the page go on without it.
"""

from __future__ import annotations

import datetime
from dataclasses import replace

from medgemma_xray.teaching.rounds import Round
from medgemma_xray.web.page_errors import refused
from medgemma_xray.web.page_wiring import PageEvents
from medgemma_xray.web.teaching_context import CHANGE_FORM, TeachingPage, logger, session_of

EVENTS = PageEvents()
PRACTICE_HELP = (
    "Practise my misses: the findings you got wrong at a reveal come back on a spaced schedule (SM-2), "
    "remembered on this server under the name you typed."
)


def change_read_of(values: dict, round_: Round) -> dict[str, str] | None:
    """The change read on the form (finding -> kind, the findings given a kind), for a case with a change key."""
    if round_.prior is None or round_.prior.change_key is None:
        return None
    read = {}
    for name in CHANGE_FORM:
        kind = values.get(name) or ""
        if kind:
            read[name.removeprefix("change_")] = str(kind)
    return read


def missed_and_right(round_: Round) -> tuple[set[str], set[str]]:
    """The findings the student got wrong at the reveal (a presence answered wrongly, or a change read wrongly)
    and those got right (answered and right, not missed elsewhere)."""
    from medgemma_xray.teaching.change_scoring import score_changes
    from medgemma_xray.teaching.scoring import score_read

    missed: set[str] = set()
    right: set[str] = set()
    if round_.key is not None and round_.student_read is not None:
        for mark in score_read(round_.student_read, round_.key, answered_only=True).marks:
            if mark.assessed and mark.field.startswith("present."):
                (right if mark.right else missed).add(mark.field.removeprefix("present."))
    prior = round_.prior
    if prior is not None and prior.change_key is not None and round_.change_read is not None:
        for change in score_changes(round_.change_read, prior.change_key).marks:
            (right if change.right else missed).add(change.finding)
    return missed, right - missed


def change_markdown(round_: Round) -> str:
    """The change read's table after the reveal (key, student, and the model where its statement was asked and
    states the finding), then the model's statement itself."""
    from medgemma_xray.teaching.change_scoring import change_text, model_changes, score_changes

    prior = round_.prior
    if prior is None or prior.change_key is None:
        return ""
    listed = "; ".join(f"{f.replace('_', ' ')} {k}" for f, k in prior.change_key.items()) or "no interval change"
    lines = ["**What changed since the prior**", "", f"Key: {listed}.", ""]
    model = model_changes(prior.statement) if prior.statement else None
    if round_.change_read is None:
        lines.append("No change read entered (quiz off).")
    else:
        score = score_changes(round_.change_read, prior.change_key)
        lines += [f"Student: {score.summary()}.", "", "| Finding | Key | Student | Model |", "|---|---|---|---|"]
        for m in score.marks:
            said = "–" if model is None else change_text(model.get(m.finding))
            lines.append(
                f"| {m.label} | {m.key} | {change_text(m.read)} ({'right' if m.right else '**wrong**'}) | {said} |"
            )
    lines.append("")
    lines.append(
        f"The model on what changed: _{prior.statement}_"
        if prior.statement
        else "The model on what changed: press **What changed since the prior?** to ask it."
    )
    return "\n".join(lines)


def remember(page: TeachingPage, round_: Round, student: str | None) -> str:
    """Record the revealed case's misses for the student; a line for the reveal (or the reason nothing was kept)."""
    from medgemma_xray.teaching.practice import PracticeMemoryError

    missed, right = missed_and_right(round_)
    if not missed and not right:
        return ""
    try:
        page.practice.record_reveal(student, missed, right, datetime.date.today())
    except PracticeMemoryError as exc:
        logger.warning("teaching: the practice memory was not updated (%s)", type(exc).__name__)
        return f"⚠️ {exc}"
    if not missed:
        return ""
    names = ", ".join(sorted(f.replace("_", " ") for f in missed))
    return f"Remembered for **Practise my misses**: {names}."


def after_reveal(page: TeachingPage, round_: Round, student: str | None) -> str:
    """What the reveal adds below the report: the change read's score (a case with a prior) and which misses
    were remembered for practice."""
    parts = [change_markdown(round_), remember(page, round_, student)]
    return "\n\n".join(part for part in parts if part)


@EVENTS.on(["practise_button.click"], inputs=["student_name", "session"], outputs=["case_list", "order_note", "session"],
           api_name="teaching_practise")  # fmt: skip
def practise(page: TeachingPage, values: dict) -> dict:
    """A round of library cases that show the student's due missed findings, new cases first."""
    import gradio as gr

    from medgemma_xray.teaching.practice import PracticeMemoryError, due_findings, practice_case_ids

    student = values.get("student_name")
    try:
        cards = page.practice.cards(student)
    except PracticeMemoryError as exc:
        raise refused(str(exc), logger, "teaching") from exc
    due = due_findings(cards, datetime.date.today())
    if not due:
        return {"order_note": f"Nothing to practise today: none of your missed findings is due. {PRACTICE_HELP}"}
    names = ", ".join(f.replace("_", " ") for f in due)
    library = page.library()
    shows = [(case.case_id, _findings_shown(case)) for case in library.cases]
    session = session_of(values)
    held = session.value
    seen = {getattr(held.current, "case_id", "")} | {
        case.case_id for case in library.cases if case.title in {r.title for r in held.records}
    }
    chosen = practice_case_ids(due, shows, seen)
    if not chosen:
        return {"order_note": f"Due for practice: {names}; no case in the library shows them. Ask the teacher."}
    session.update(lambda s: replace(s, order=tuple(chosen)))
    titles = [library.get(case_id).title for case_id in chosen]
    return {
        "case_list": gr.update(value=chosen[0]),
        "order_note": f"Practice round for your misses ({names}): {', '.join(titles)}. Open the case, then Next case.",
        "session": session,
    }


def _findings_shown(case) -> frozenset[str]:
    """The findings a library case shows: present in its key, or changed since its prior."""
    from medgemma_xray.phantoms.findings import FINDINGS

    shown = {f for f in FINDINGS if case.key is not None and case.key.present(f)}
    if case.prior is not None and case.prior.changes:
        shown |= {c.finding for c in case.prior.changes if c.kind != "unchanged"}
    return frozenset(shown)
