"""/teaching's pointing: the student's marks (the Mark tool: a point, or a box from two opposite corners), the
model's "Where?" (its boxes drawn on the film), the overlays after Reveal (key region, student's marks, model's
boxes, each switchable), the per-finding pointing score, and the marks as a DICOM SR (TID 1500).

Where? goes the question path's way (web.asking): checked in a step of its own before it waits for a decode
slot (the quiz lock, the rules on the typed finding's name, the prompt's fit), one answer at a time per case,
Stop by the answer's server-side token, and written only into the case it started on. Logic lives in teaching/
(marks, mark_scoring, overlays, model_location, pointing_report, measurement_sr).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from medgemma_xray.teaching.marks import LAYER_NAMES, LAYERS, Mark, Pointing, finding_name, shown_name
from medgemma_xray.teaching.rounds import Round
from medgemma_xray.web import teaching_answers
from medgemma_xray.web.page_errors import refused, shown
from medgemma_xray.web.page_session import SessionSlot
from medgemma_xray.web.page_wiring import PageEvents
from medgemma_xray.web.teaching_answers import _claim, _release, _throttled
from medgemma_xray.web.teaching_context import (
    QUESTIONS_LOCKED,
    TeachingPage,
    current_round,
    logger,
    questions_locked,
    session_of,
)
from medgemma_xray.web.teaching_view import TOOL_CLICKS, VIEW_OUT, view_outputs

EVENTS = PageEvents()
MARKS_OUT = [*VIEW_OUT, "session", "mark_list", "overlay_legend"]
LOCKED = "The marks are locked: this case is revealed. Open the next case to mark again."
BUSY = "Wait for the model's answer on this case to finish (or press Stop), then mark."


def mark_choices() -> list[tuple[str, str]]:
    from medgemma_xray.phantoms.findings import FINDINGS

    return [(shown_name(finding), finding) for finding in FINDINGS]


def overlay_choices() -> list[tuple[str, str]]:
    return [(LAYER_NAMES[layer], layer) for layer in LAYERS]


def _pointing_outputs(page: TeachingPage, round_: Round) -> dict[str, Any]:
    """The view with its overlays, the list of marks (locked after Reveal) and the legend in words."""
    import gradio as gr

    from medgemma_xray.teaching.overlays import legend_markdown
    from medgemma_xray.teaching.pointing import layers_of

    pointing = round_.pointing
    choices = [(f"{index + 1}. {mark.text()}", index) for index, mark in enumerate(pointing.marks)]
    return {
        **view_outputs(page, round_),
        "mark_list": gr.update(choices=choices, value=None, interactive=not pointing.locked),
        "overlay_legend": legend_markdown(layers_of(pointing).drawn()),
    }


def _changed(page: TeachingPage, session: SessionSlot, round_: Round, changed: Round) -> dict[str, Any]:
    held = session.update(lambda s: s.updated(changed) if s.current is round_ else s)
    if held.current is not changed:
        return {}
    return {**_pointing_outputs(page, changed), "session": session}


NEW_CASE_OUT = ["mark_list", "overlay_legend", "mark_score", "where_note"]


def new_case_outputs(page: TeachingPage, round_: Round) -> dict[str, Any]:
    """What a newly opened case shows of pointing (web.teaching_page.show_case): no marks, no score, and why
    Where? is off if it is (its view, with no overlay yet, is show_case's own)."""
    from medgemma_xray.teaching.model_location import localises, not_localising

    outputs = _pointing_outputs(page, round_)
    return {
        "mark_list": outputs["mark_list"],
        "overlay_legend": outputs["overlay_legend"],
        "mark_score": "",
        "where_note": "" if localises(page.service.info()) else not_localising(page.service.info()),
    }


def mark_clicked(page: TeachingPage, values: dict, event) -> dict:
    """A click with the Mark tool (web.teaching_view.clicked hands it here): a point at once, or a box's first
    corner and then its opposite corner. Returns MARKS_OUT's updates."""
    import gradio as gr

    from medgemma_xray.teaching import viewer

    session, _, round_ = current_round(values)
    if round_.pointing.locked or round_.revealed:
        gr.Warning(LOCKED)
        return {}
    if page.asking.is_answering(round_.conversation_id):
        gr.Warning(BUSY)
        return {}
    try:
        finding = finding_name(values["mark_finding"])
    except ValueError as exc:
        gr.Warning(str(exc))
        return {}
    x, y = event.index
    rows, cols = round_.display.shape
    row, col = viewer.view_crop(round_.display.shape, round_.view).to_film(float(x), float(y))
    if round_.prior is not None:  # the prior beside the film: a mark is on the current film (either half)
        from medgemma_xray.teaching.paired_view import current_film_point

        point = current_film_point(round_.prior.display, round_.display, round_.view, float(x), float(y))
        if point is None:
            return {}
        row, col = point
    at = ((row + 0.5) / rows, (col + 0.5) / cols)
    view = round_.view
    try:
        if values["mark_shape"] == "box" and not view.points:  # the first corner, drawn until the second
            return _changed(page, session, round_, replace(round_, view=replace(view, points=((row, col),))))
        if values["mark_shape"] == "box":
            first_row, first_col = view.points[0]
            mark = Mark.box(finding, ((first_row + 0.5) / rows, (first_col + 0.5) / cols), at)
        else:
            mark = Mark.point(finding, *at)
        pointing = round_.pointing.with_mark(mark)
    except ValueError as exc:
        gr.Warning(str(exc))
        return _changed(page, session, round_, replace(round_, view=replace(view, points=())))
    return _changed(page, session, round_, replace(round_, pointing=pointing, view=replace(view, points=())))


TOOL_CLICKS["mark"] = mark_clicked  # the view's one select listener hands the Mark tool's clicks here


@EVENTS.on(["mark_remove.click"], inputs=["mark_list", "session"], outputs=MARKS_OUT, api_name="teaching_remove_mark")
def remove_mark(page: TeachingPage, values: dict) -> dict:
    session, _, round_ = current_round(values)
    index = values["mark_list"]
    if index is None or index == "":
        raise refused("Pick a mark in the list first, then press Remove.", logger, "teaching")
    try:
        pointing = round_.pointing.without_mark(int(index))
    except (TypeError, ValueError) as exc:
        message = str(exc) if isinstance(exc, ValueError) else "Pick a mark in the list first."
        raise refused(message, logger, "teaching") from exc
    return _changed(page, session, round_, replace(round_, pointing=pointing))


@EVENTS.on(["overlay_toggle.change"], inputs=["overlay_toggle", "session"], outputs=MARKS_OUT,
           api_name="teaching_overlays")  # fmt: skip
def overlays_changed(page: TeachingPage, values: dict) -> dict:
    held = session_of(values).value.current
    if held is None:
        return {}
    session, _, round_ = current_round(values)
    shown_layers = frozenset(layer for layer in values["overlay_toggle"] or () if layer in LAYERS)
    return _changed(page, session, round_, replace(round_, pointing=replace(round_.pointing, shown=shown_layers)))


# --- Where? ----------------------------------------------------------------------------------------------------------
def _where_request(page: TeachingPage, round_: Round, finding: str):
    from medgemma_xray.grounding.prompts import localisation_prompt
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
    from medgemma_xray.phantoms.regions import OBJECT_NAMES
    from medgemma_xray.web.asking import AskRefused

    asked = OBJECT_NAMES.get(finding, finding)  # the name the prompt asks for ("enlarged heart"), as trained
    request = GenerationRequest(
        image=round_.model_image,
        turns=(ChatTurn("user", localisation_prompt(asked)),),
        max_new_tokens=page.settings.max_new_tokens,
        image_key=round_.image_key,
    )
    try:
        page.asking.check_template(request, asked)
    except AskRefused as exc:
        raise shown(exc, logger, "teaching") from exc
    return request


@EVENTS.on(["route.load"], outputs=["where_button", "where_note"])
def where_available(page: TeachingPage, values: dict) -> dict:
    """Where? is offered only when the serving checkpoint localises findings; otherwise the button says why."""
    import gradio as gr

    from medgemma_xray.teaching.model_location import localises, not_localising

    info = page.service.info()
    if localises(info):
        return {"where_button": gr.update(interactive=True, value="Where? (the model points)"), "where_note": ""}
    return {"where_button": gr.update(interactive=False, value="Where? (not with this checkpoint)"),
            "where_note": not_localising(info)}  # fmt: skip


@EVENTS.on(["where_button.click"], inputs=["mark_finding", "quiz", "session"], outputs=["where_asked"],
           concurrency_limit=None)  # fmt: skip
def take_where(page: TeachingPage, values: dict) -> dict:
    """Checked before it is queued: a case, the checkpoint's capability, the quiz lock, the finding's name."""
    from medgemma_xray.teaching.model_location import localises, not_localising
    from medgemma_xray.web.asking import WAIT_MESSAGE

    _, _, round_ = current_round(values)
    if not localises(page.service.info()):
        raise refused(not_localising(page.service.info()), logger, "teaching")
    if questions_locked(page, bool(values["quiz"]), round_):
        raise refused(QUESTIONS_LOCKED, logger, "teaching")
    try:
        finding = finding_name(values["mark_finding"])
    except ValueError as exc:
        raise refused(str(exc), logger, "teaching") from exc
    _where_request(page, round_, finding)
    if page.asking.is_answering(round_.conversation_id):
        raise refused(WAIT_MESSAGE, logger, "teaching")
    return {"where_asked": finding}


def _locate(page: TeachingPage, round_: Round, finding: str, ticket):
    """Yields the answer's text as it streams, then its ModelLocation (last)."""
    from medgemma_xray.inference_api.types import GenerationStats
    from medgemma_xray.teaching.model_location import location_from_answer

    text = ""
    for text in _throttled(page.asking.stream(_where_request(page, round_, finding), ticket,
                                                              GenerationStats())):  # fmt: skip
        if ticket.superseded:
            return
        yield text
    yield location_from_answer(finding, text, round_.display.shape, stopped=ticket.stopped.is_set())


@EVENTS.on(["take_where.success"], inputs=["where_asked", "session"], outputs=[*MARKS_OUT, "where_note"],
           request=True, api_name="teaching_where", concurrency_id="generation")  # fmt: skip
def where(page: TeachingPage, values: dict, request) -> Any:
    """The model's boxes for one finding, drawn on the film (a notice when it locates nothing)."""
    from medgemma_xray.teaching.marks import ModelLocation

    session, _, round_ = current_round(values)
    finding = finding_name(values["where_asked"])
    ticket = _claim(page, session, round_, request)
    name = shown_name(finding)
    try:
        yield {"where_note": f"_Asking the model where the {name} is..._"}
        for step in _locate(page, round_, finding, ticket):
            if isinstance(step, ModelLocation):
                changed = replace(round_, pointing=round_.pointing.with_location(step))
                drawn = f"The model's box for the {name}: {len(step.boxes)} drawn." if step.boxes else ""
                yield {**_changed(page, session, round_, changed), "where_note": step.notice or drawn}
            else:
                yield {"where_note": f"_Asking the model where the {name} is..._\n\n```text\n{step[-600:]}\n```"}
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    finally:
        _release(page, session, ticket)


# --- after Reveal ----------------------------------------------------------------------------------------------------
def _findings_to_locate(round_: Round) -> list[str]:
    """The key's findings present, else (no key) those the model's report called present."""
    from medgemma_xray.phantoms.findings import FINDINGS

    if round_.key is not None:
        return [finding for finding in FINDINGS if round_.key.present(finding)]
    read = round_.model_read or {}
    return [finding for finding in FINDINGS if read.get(f"present.{finding}")]


def _score_markdown(round_: Round) -> str:
    from medgemma_xray.teaching.mark_scoring import TOLERANCES_TEXT
    from medgemma_xray.teaching.pointing import NO_REGIONS
    from medgemma_xray.teaching.pointing_report import score_pointing

    if round_.key is None:
        return "**Pointing:** no answer key for this film, so the marks are not scored."
    pointing = round_.pointing
    scores = score_pointing(pointing, round_.key, pointing.model_asked)
    lines = [
        f"**Pointing score: you {scores.student_summary()}; the model {scores.model_summary()}**",
        "",
        "| Finding | Criterion | Key | You | Model |",
        "|---|---|---|---|---|",
        *(f"| {' | '.join(row)} |" for row in scores.rows()),
        "",
        f"_Tolerances: {TOLERANCES_TEXT}_",
    ]
    if pointing.key_regions is None:
        lines.append(f"\n_{NO_REGIONS}_")
    return "\n".join(lines)


def _regions_of(round_: Round):
    try:
        return round_.key_regions()
    except ImportError:  # phantoms.regions not in this build: the case is scored without regions
        logger.warning("key regions unavailable: phantoms.regions is missing")
        return None


# Chained after Reveal's own step, so it is declared among /teaching's answers (web.teaching_answers' EVENTS).
@teaching_answers.EVENTS.on(["reveal.success"], inputs=["session"],
                            outputs=[*MARKS_OUT, "mark_score", "where_note"], request=True,
                            concurrency_id="generation")  # fmt: skip
def after_reveal(page: TeachingPage, values: dict, request) -> Any:
    """Once the case is revealed: the marks lock, the key's regions show, the model is
    asked Where? for each finding (if it localises), and every finding's pointing is scored. Runs once per case."""
    from medgemma_xray.teaching.marks import ModelLocation
    from medgemma_xray.teaching.model_location import localises, not_localising

    held = session_of(values).value.current
    if held is None or not held.revealed or held.pointing.locked:
        return
    session, _, round_ = current_round(values)
    asks = localises(page.service.info())
    pointing = replace(round_.pointing, locked=True, key_regions=_regions_of(round_), model_asked=asks)
    current = replace(round_, pointing=pointing)
    yield {**_changed(page, session, round_, current), "mark_score": _score_markdown(current)}
    if not asks:
        yield {"where_note": not_localising(page.service.info())}
        return
    ticket = _claim(page, session, current, request)
    notices = []
    try:
        for finding in _findings_to_locate(current):
            yield {"where_note": f"_Asking the model where the {shown_name(finding)} is..._"}
            for step in _locate(page, current, finding, ticket):
                if isinstance(step, ModelLocation):
                    located = replace(current, pointing=current.pointing.with_location(step))
                    update = _changed(page, session, current, located)
                    if not update:
                        return  # another case is on screen
                    current = located
                    notices += [step.notice] if step.notice else []
                    yield {**update, "mark_score": _score_markdown(current)}
            if ticket.superseded or ticket.stopped.is_set():
                break
        yield {"where_note": " ".join(notices)}
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    finally:
        _release(page, session, ticket)


# --- the SR ----------------------------------------------------------------------------------------------------------
@EVENTS.on(["marks_sr_button.click"], inputs=["identifiers", "session"], outputs=["marks_sr"],
           api_name="teaching_marks_sr")  # fmt: skip
def export_marks_sr(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    from medgemma_xray.teaching.measurement_sr import MODEL, STUDENT, SrMark, measurement_sr_bytes
    from medgemma_xray.teaching.pointing_report import model_marks
    from medgemma_xray.web.teaching_exports import _export_folder, _write_private, export_label, export_stem

    _, _, round_ = current_round(values)
    pointing: Pointing = round_.pointing
    marks = [SrMark(STUDENT, m) for m in pointing.marks] + [SrMark(MODEL, m) for m in model_marks(pointing)]
    if not marks:
        raise refused("No marks to export: mark a finding on the film (the Mark tool) first.", logger, "teaching")
    info = page.service.info()
    allowed = bool(values["identifiers"]) and page.settings.sr_include_identifiers
    try:
        data = measurement_sr_bytes(
            marks,
            round_.display.shape,
            round_.display.dicom_identity,
            include_identifiers=allowed,
            model_name=info.model_id if info is not None else "",
        )
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    folder = _export_folder(page, "teaching-marks-")
    path = _write_private(folder, f"{export_stem('teaching-marks', export_label(round_.title))}-sr.dcm", data)
    return {"marks_sr": gr.update(value=path, visible=True)}
