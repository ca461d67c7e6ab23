"""/teaching's answers: Reveal (the model's report, scored against the key and the student's read) and questions,
both streamed, bound to the case they started on, and stoppable; the main page's rules through web.asking.

A question is checked in a step of its own before it waits for a decode slot (refused at once with a toast, the
text kept in the box), the box is cleared once it is taken, and the answer claims the case's conversation: a
second question while it runs is refused. Stop ends it by the answer's server-side token.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from medgemma_xray.teaching.rounds import Round
from medgemma_xray.web import teaching_practice
from medgemma_xray.web.page_errors import refused, shown
from medgemma_xray.web.page_session import SessionSlot
from medgemma_xray.web.page_wiring import PageEvents
from medgemma_xray.web.teaching_context import (
    FORM,
    FORM_DEFAULTS,
    QUESTIONS_LOCKED,
    TeachingPage,
    current_round,
    logger,
    question_controls,
    questions_locked,
    read_form,
    session_of,
)

STREAM_INTERVAL_S = 0.1
ANSWER_STOPPED = "*Stopped. Ask again or ask another question.*"
REVEAL_STOPPED = "*Stopped before the report was complete. Press Reveal to run it again.*"
EVENTS = PageEvents()


PRESENCE_BOXES = {
    "present.pleural_effusion": "read_effusion",
    "present.cardiomegaly": "read_cardiomegaly",
    "present.pneumothorax": "read_pneumothorax",
    "present.nodule_or_mass": "read_nodule",
    "present.consolidation": "read_consolidation",
    "present.endotracheal_tube": "read_ett",
    "present.central_line": "read_line",
    "present.pacemaker": "read_pacemaker",
}


def _student_read(values: dict) -> tuple[dict, str]:
    """The read form's values (keyed by component name) as a scoring read, and the free-text notes. Only what the
    student answered: a ticked finding is present; an unticked one is absent only when "every finding I did not
    tick is absent" is ticked, else not assessed (an empty read is not a read of a normal film). An empty choice
    or number is not assessed."""

    def v(name: str):
        return values.get(name, FORM_DEFAULTS[name])

    rest_absent = bool(v("read_rest_absent"))
    read: dict = {}
    for field, box in PRESENCE_BOXES.items():
        if v(box):
            read[field] = True
        elif rest_absent:
            read[field] = False
    optional = {
        "cardiothoracic_ratio": v("read_ctr"),
        "technique.rotated": {"yes": True, "no": False}.get(v("read_rotated") or ""),
        "technique.inspiration": v("read_inspiration"),
        "technique.exposure": v("read_exposure"),
        "effusion.side": v("read_effusion_side") if read.get("present.pleural_effusion") else None,
        "effusion.size": v("read_effusion_size") if read.get("present.pleural_effusion") else None,
        "pneumothorax.side": v("read_pneumothorax_side") if read.get("present.pneumothorax") else None,
        "pneumothorax.size": v("read_pneumothorax_size") if read.get("present.pneumothorax") else None,
        "nodule.lobe": v("read_nodule_lobe") if read.get("present.nodule_or_mass") else None,
        "nodule.size_cm": v("read_nodule_size") if read.get("present.nodule_or_mass") else None,
        "consolidation.lobe": v("read_consolidation_lobe") if read.get("present.consolidation") else None,
        "endotracheal_tube.tip_above_carina_cm": v("read_ett_tip") if read.get("present.endotracheal_tube") else None,
        "central_line.route": v("read_line_route") if read.get("present.central_line") else None,
        "central_line.tip": v("read_line_tip") if read.get("present.central_line") else None,
        "pacemaker.side": v("read_pacemaker_side") if read.get("present.pacemaker") else None,
    }
    read.update({name: value for name, value in optional.items() if value not in (None, "")})
    return read, (v("read_notes") or "").strip()


def _scores_markdown(round_: Round, byline: str = "") -> tuple[str, str, str]:
    """(marks table, student score line, model score line) for a revealed round. The student is scored on the
    fields answered (the rest "not assessed"), the model on every field. byline: the student's name and the day."""
    from medgemma_xray.teaching.scoring import mark_text, score_read, shown

    if round_.key is None:
        return "No answer key for this film: nothing to score. Load a teacher's key to score it.", "", ""
    student = (
        score_read(round_.student_read, round_.key, answered_only=True) if round_.student_read is not None else None
    )
    model = score_read(round_.model_read or {}, round_.key)
    lines = ["| Field | Key | Student | Model |", "|---|---|---|---|"]
    for mark in model.marks:
        cell = mark_text(student.mark(mark.field), "**wrong**") if student else "–"
        lines.append(f"| {mark.label} | {shown(mark.key)} | {cell} | {mark_text(mark, '**wrong**')} |")
    student_line = f"**Student score: {student.summary()}**" if student else "Student score: no read entered"
    if round_.asked_before_reveal:
        student_line += f" · asked {round_.asked_before_reveal} question(s) before the reveal"
    if byline:
        student_line += f"  \n_{byline}_"
    return "\n".join(lines), student_line, f"**Model score: {model.summary()}**"


def byline(student: str | None) -> str:
    """The student's name as typed (kept on the page and in the exports, never logged) and today's date."""
    import datetime

    name = " ".join((student or "").split())[:80]
    day = datetime.date.today().isoformat()
    return f"{name}, {day}" if name else day


def _throttled(text_stream):
    """At most one update per STREAM_INTERVAL_S (a browser that re-renders the whole answer at every token falls
    behind a fast backend); the last text always comes."""
    shown_at, text, pending = 0.0, "", False
    for text in text_stream:
        pending = True
        if time.monotonic() - shown_at >= STREAM_INTERVAL_S:
            shown_at, pending = time.monotonic(), False
            yield text
    if pending:
        yield text


def _claim(page: TeachingPage, session: SessionSlot, round_: Round, request):
    from medgemma_xray.web.asking import client_key

    try:
        page.asking.admit(client_key(request))
        ticket = page.asking.claim(round_.conversation_id)
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    session.answer_token = ticket.stop_token
    return ticket


def _release(page: TeachingPage, session: SessionSlot, ticket) -> None:
    page.asking.release(ticket)
    if session.answer_token == ticket.stop_token:
        session.answer_token = None


@EVENTS.on(["reveal_button.click"], inputs=["quiz", *FORM, "student_name", "session"],
           outputs=["reveal_box", "student_score", "model_score", "change_box", "session"], request=True,
           api_name="teaching_reveal",
           concurrency_id="generation")  # fmt: skip
def reveal(page: TeachingPage, values: dict, request) -> Any:
    from medgemma_xray.assistant.report import report_request
    from medgemma_xray.inference_api.types import GenerationStats
    from medgemma_xray.teaching.model_read import model_read

    session, _, round_ = current_round(values)
    if round_.revealed:
        raise refused("This case is already revealed; open the next case.", logger, "teaching")
    read, notes = _student_read(values)
    changes = teaching_practice.change_read_of(values, round_)  # a case with a prior: what changed, as read
    asked = replace(round_, student_read=read, student_notes=notes, change_read=changes) if values["quiz"] else round_
    ticket = _claim(page, session, round_, request)
    generation = replace(report_request(round_.model_image, page.settings.max_new_tokens), image_key=round_.image_key)
    text = ""
    try:
        yield {"reveal_box": "**The model's report (streaming)**", "student_score": "", "model_score": ""}
        for text in _throttled(page.asking.stream(generation, ticket, GenerationStats())):
            if ticket.superseded:
                return
            yield {"reveal_box": f"**The model's report (streaming)**\n\n```text\n{text}\n```"}
        if ticket.superseded:
            return
        if ticket.stopped.is_set():  # a stopped report is not the model's read: the case stays to be revealed
            yield {"reveal_box": f"**The model's report (stopped)**\n\n```text\n{text}\n```\n\n{REVEAL_STOPPED}"}
            return
        revealed = replace(asked, model_report=text, model_read=model_read(text), revealed=True)
        held = session.update(lambda s: s.updated(revealed) if s.current is round_ else s)
        if held.current is not revealed:
            return
        table, student_line, model_line = _scores_markdown(revealed, byline(values.get("student_name")))
        points = "".join(f"\n- {p}" for p in revealed.teaching_points)
        box = f"**The model's report**\n\n```text\n{text}\n```\n\n{table}" + (
            f"\n\n**Teaching points**{points}" if points else ""
        )
        after = teaching_practice.after_reveal(page, revealed, values.get("student_name"))  # the prior, practice
        yield {"reveal_box": box, "student_score": student_line, "model_score": model_line, "change_box": after,
               "session": session}  # fmt: skip
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    finally:
        _release(page, session, ticket)


@EVENTS.on(["reveal.success"], inputs=["quiz", "session"], outputs=[*FORM, "question", "ask_button"])
def lock_read(page: TeachingPage, values: dict) -> dict:
    """After the reveal the read is the one that was scored: the form locks until the next case; the questions
    open."""
    held = session_of(values).value
    if held.current is None or not held.current.revealed:
        return {}
    return {**read_form(interactive=False), **question_controls(False)}


def _question_request(page: TeachingPage, round_: Round, question: str):
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
    from medgemma_xray.web.asking import AskRefused

    if not question:
        raise refused("Type a question before asking.", logger, "teaching")
    turns = tuple(t for q, a in round_.questions for t in (ChatTurn("user", q), ChatTurn("assistant", a)))
    request = GenerationRequest(
        image=round_.model_image,
        turns=(*turns, ChatTurn("user", question)),
        max_new_tokens=page.settings.max_new_tokens,
        conversation_id=round_.conversation_id,
        image_key=round_.image_key,
    )
    try:
        page.asking.check(request)
    except AskRefused as exc:
        raise shown(exc, logger, "teaching") from exc
    return request


@EVENTS.on(["ask_button.click", "question.submit"], inputs=["question", "quiz", "session"], outputs=["asked"],
           concurrency_limit=None)  # fmt: skip
def take_question(page: TeachingPage, values: dict) -> dict:
    """Checked before it is queued (the main page's rules, and guess first in quiz mode): refused at once with a
    message, the text kept."""
    from medgemma_xray.web.asking import WAIT_MESSAGE

    _, _, round_ = current_round(values)
    if questions_locked(page, bool(values["quiz"]), round_):
        raise refused(QUESTIONS_LOCKED, logger, "teaching")
    question = (values["question"] or "").strip()
    _question_request(page, round_, question)
    if page.asking.is_answering(round_.conversation_id):
        raise refused(WAIT_MESSAGE, logger, "teaching")
    return {"asked": question}


@EVENTS.on(["take_question.success"], outputs=["question"], queue=False)
def clear_question(page: TeachingPage, values: dict) -> dict:
    return {"question": ""}


@EVENTS.on(["clear_question.success"], inputs=["asked", "session"], outputs=["chat", "asked", "session"], request=True,
           api_name="teaching_ask", concurrency_id="generation")  # fmt: skip
def answer(page: TeachingPage, values: dict, request) -> Any:
    """The answer to a question taken by take_question (which holds the quiz lock; an API client asks here
    directly, and a question before the reveal is then recorded with the case: asked_before_reveal)."""
    from medgemma_xray.inference_api.types import GenerationStats

    session, _, round_ = current_round(values)
    question = (values["asked"] or "").strip()
    generation = _question_request(page, round_, question)
    ticket = _claim(page, session, round_, request)
    history = [
        m for q, a in round_.questions for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})
    ]
    history.append({"role": "user", "content": question})
    text = ""
    try:
        yield {"chat": history + [{"role": "assistant", "content": ""}]}  # the question shows at once
        for text in _throttled(page.asking.stream(generation, ticket, GenerationStats())):
            if ticket.superseded:
                return
            yield {"chat": history + [{"role": "assistant", "content": text}]}
        if ticket.superseded:
            return
        # A stopped answer stays in the conversation as far as it went; the model's next turn sees the same text.
        early = 0 if round_.revealed else 1  # recorded: the read was (or will be) committed after seeing it
        asked = replace(
            round_,
            questions=(*round_.questions, (question, text)),
            asked_before_reveal=round_.asked_before_reveal + early,
        )
        held = session.update(lambda s: s.updated(asked) if s.current is round_ else s)
        if held.current is not asked:
            return
        shown_text = f"{text}\n\n{ANSWER_STOPPED}" if ticket.stopped.is_set() else text
        yield {"chat": history + [{"role": "assistant", "content": shown_text}], "asked": "", "session": session}
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    finally:
        _release(page, session, ticket)


@EVENTS.on(["stop_button.click"], inputs=["session"], queue=False, api_name="teaching_stop")
def stop(page: TeachingPage, values: dict) -> None:
    """Stop: this session's running answer or report ends at its next piece of text, keeping what it said. Keyed
    by the answer's server-side token, which no client can name."""
    page.asking.stop(session_of(values).answer_token)
