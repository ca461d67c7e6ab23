"""The teaching-rounds page (/teaching): the case library, the viewer, guess-first quiz, questions, Stop, the
report with its clinical context and SR export, and the session export. Logic lives in teaching/; this module is
the layout (add_teaching_page) and module-level handlers, each declared with the events that run it
(web.page_wiring).

It keeps the main page's rules: films through the one intake (no toast per warning: they are in the case's
notes), questions through web.asking (limits on the whole conversation, one answer at a time per case, Stop by
a server-side token), and each stream bound to the case it started on (web.page_session). A session keeps the
viewer's overview of its film; the full-resolution values stay once in the intake's shared cache.
The viewer renders on the server (medgemma_xray.teaching.viewer): each window, zoom, pan or click returns a new
picture.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medgemma_xray.teaching.rounds import Round, TeachingSession, library_round, round_of, upload_names
from medgemma_xray.web import (
    teaching_answers,
    teaching_compare,
    teaching_exports,
    teaching_marks,
    teaching_practice,
    teaching_view,
)
from medgemma_xray.web.page_errors import refused, shown
from medgemma_xray.web.page_session import SessionSlot
from medgemma_xray.web.page_style import page_style
from medgemma_xray.web.page_wiring import PageEvents
from medgemma_xray.web.teaching_context import (
    FORM,
    PREVIEW_SIZE,
    TeachingPage,
    ViewFiles,
    current_round,
    hidden_update,
    logger,
    question_controls,
    questions_locked,
    read_form,
    session_of,
)
from medgemma_xray.web.teaching_keys import HELP_JS, PROJECTOR_JS, TEACH_STYLE, help_html, keys_js
from medgemma_xray.web.teaching_view import VIEW_OUT, view_outputs

if TYPE_CHECKING:
    from medgemma_xray.intake import FilmIntake
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.asking import Asking
    from medgemma_xray.web.upload_cache import UploadInbox

FINDING_CHOICES = {
    "effusion_side": ["", "right", "left", "both"],
    "effusion_size": ["", "small", "moderate", "large"],
    "side": ["", "right", "left"],
    "pneumothorax_size": ["", "small", "large"],
    "yes_no": ["", "yes", "no"],
    "inspiration": ["", "adequate", "poor"],
    "exposure": ["", "adequate", "under", "over"],
}
# The clickable view is one image button for the ruler, calliper and pan: its accessible name says so.
VIEW_ALT = "The film at full resolution: click to place a ruler or calliper point, or to pan"


EVENTS = PageEvents()

# --- cases ---------------------------------------------------------------------------------------------------------
OPENED = ["case_info", "session"]  # what opening a case (the step that may refuse) changes
SHOWN = [*VIEW_OUT, "model_view", "reveal_box", "student_score", "model_score", "chat", "indication", "comparison",
         "recommendation", "report_md", "report_sr", "question", "ask_button", *FORM,
         *teaching_marks.NEW_CASE_OUT, "marks_sr", *teaching_compare.PRIOR_CONTROLS, "change_box"]  # fmt: skip


def _case_markdown(round_: Round) -> str:
    key = "answer key loaded" if round_.key is not None else "no answer key"
    display = round_.display
    calibration = (
        f"pixel spacing {display.pixel_spacing_mm[1]:.4g} mm" if display.pixel_spacing_mm else "uncalibrated (no pixel spacing)"
    )  # fmt: skip
    rows, cols = display.shape
    notes = "".join(f"\n- ⚠️ {warning}" for warning in round_.warnings)
    return (
        f"### {round_.title}\n**History:** {round_.history or '–'}\n\n"
        f"_{round_.film.source}, {cols}×{rows} px; {key}; {calibration}_" + (f"\n{notes}" if notes else "")
    )


def _preview_of(image):
    preview = image.resize((PREVIEW_SIZE, PREVIEW_SIZE))
    preview.info["upload"] = uuid.uuid4().hex  # its own cache file (see the main page's load_film)
    return preview


def leave_round(page: TeachingPage, held: TeachingSession, wait_s: float = 10.0) -> None:
    """The case on screen is replaced: its running answer or report stops and writes nothing more (the new case's
    reply waits for its stream to end, so no last update of it lands after); its KV is freed."""
    if held.current is not None:
        page.asking.end_conversation(held.current.conversation_id, wait_s=wait_s)
        page.service.forget_conversation(held.current.conversation_id)


def _opened(page: TeachingPage, session: SessionSlot[TeachingSession], round_: Round, forbidden=frozenset()) -> dict:
    """The case goes on screen: its notes now; the rest of the screen in the step that follows (show_case)."""
    leave_round(page, session.value)
    session.update(lambda s: s.with_round(round_, forbidden))
    return {"case_info": _case_markdown(round_), "session": session}


def show_case(page: TeachingPage, values: dict) -> dict:
    """Everything else a newly opened case changes: the view, what the model sees, an empty read and chat. A step
    of its own after the one that opens the case, which alone can refuse: an error marks its outputs, and the read
    form's inputs must never carry one."""
    held = session_of(values).value
    if held.current is None:
        return {}
    round_ = held.current
    return {
        **view_outputs(page, round_),
        "model_view": _preview_of(round_.model_image),
        "reveal_box": "",
        "student_score": "",
        "model_score": "",
        "chat": [],
        "indication": round_.history,
        "comparison": round_.comparison,
        "recommendation": "",
        "report_md": hidden_update(),
        "report_sr": hidden_update(),
        **read_form(interactive=True, reset=True),  # a new case starts a fresh read
        **question_controls(questions_locked(page, bool(values.get("quiz", True)), round_)),
        **teaching_marks.new_case_outputs(page, round_),
        "marks_sr": hidden_update(),
        **teaching_compare.prior_controls(page, round_),  # the prior's controls (a case with a prior film)
        "change_box": "",
    }


def _read_film(page: TeachingPage, data: bytes):
    """The film for the model and for the viewer, from the one intake's one decode."""
    from medgemma_xray.teaching.viewer import display_film

    film, values = page.intake.read_with_values(data)
    return film, display_film(values, film.source, film.key)


@EVENTS.on(["open_button.click"], inputs=["case_list", "session"], outputs=OPENED, api_name="teaching_open_case")
def open_case(page: TeachingPage, values: dict) -> dict:
    case_id = values["case_list"]
    if not case_id:
        raise refused("Pick a case in the library list first.", logger, "teaching")
    session = session_of(values)
    try:
        case = page.library().get(case_id)
    except KeyError as exc:
        raise refused("That case is no longer in the library; refresh the list.", logger, "teaching") from exc
    try:
        film, display = _read_film(page, case.film_path.read_bytes())
        prior = teaching_compare.library_prior(page, case)  # its prior film, through the same intake
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    return _opened(page, session, replace(library_round(case, film, display), prior=prior))


@EVENTS.on(["open_case.success"], inputs=["quiz", "session"], outputs=SHOWN)
def show_opened_case(page: TeachingPage, values: dict) -> dict:
    return show_case(page, values)


@EVENTS.on(["next_button.click"], inputs=["session"], outputs=OPENED, api_name="teaching_next_case")
def next_case(page: TeachingPage, values: dict) -> dict:
    case_id = session_of(values).value.next_case_id()
    if case_id is None:
        raise refused("No next case: press Shuffle for a quiz order (or the round is over).", logger, "teaching")
    return open_case(page, {**values, "case_list": case_id})


@EVENTS.on(["next_case.success"], inputs=["quiz", "session"], outputs=["case_list", *SHOWN])
def show_next_case(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    current = session_of(values).value.current
    return {"case_list": gr.update(value=getattr(current, "case_id", None)), **show_case(page, values)}


@EVENTS.on(["shuffle_button.click"], inputs=["session"], outputs=["case_list", "order_note", "session"],
           api_name="teaching_shuffle")  # fmt: skip
def shuffle(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    session = session_of(values)
    library = page.library()
    held = session.update(lambda s: s.shuffled_order([case.case_id for case in library.cases]))
    titles = [library.get(case_id).title for case_id in held.order]
    return {
        "case_list": gr.update(value=held.order[0] if held.order else None),
        "order_note": f"Quiz order: {', '.join(titles)}",
        "session": session,
    }


@EVENTS.on(["film_upload.upload"], inputs=["film_upload", "session"], outputs=OPENED,
           api_name="teaching_upload_film")  # fmt: skip
def upload_film(page: TeachingPage, values: dict) -> dict:
    file_path = values["film_upload"]
    if not file_path:
        raise refused("No file received. Drop a chest X-ray (DICOM, PNG or JPEG) onto the upload box.", logger,
                      "teaching")  # fmt: skip
    session = session_of(values)
    try:
        data = page.uploads.take(file_path)
        film, display = _read_film(page, data)
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    held = session.update(lambda s: replace(s, uploads=s.uploads + 1))
    round_ = round_of(f"Uploaded film {held.uploads}", film, display)
    forbidden = upload_names(file_path) | set(display.dicom_identity.values())
    return _opened(page, session, round_, forbidden)


@EVENTS.on(["upload_film.success"], inputs=["quiz", "session"], outputs=SHOWN)
def show_uploaded_case(page: TeachingPage, values: dict) -> dict:
    return show_case(page, values)


@EVENTS.on(["key_upload.upload"], inputs=["key_upload", "session"], outputs=["case_info", "session"],
           api_name="teaching_upload_key")  # fmt: skip
def upload_key(page: TeachingPage, values: dict) -> dict:
    from medgemma_xray.teaching.keys import key_from_json

    session, _, round_ = current_round(values)
    if not values["key_upload"]:
        raise refused("No key file received.", logger, "teaching")
    try:
        key = key_from_json(page.uploads.take(values["key_upload"]), "The key file")
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    keyed = replace(round_, key=key)
    session.update(lambda s: s.updated(keyed) if s.current is round_ else s)
    return {"case_info": _case_markdown(keyed), "session": session}


@EVENTS.on(["quiz.change"], inputs=["quiz", "session"], outputs=["question", "ask_button"])
def quiz_changed(page: TeachingPage, values: dict) -> dict:
    """Quiz on: the questions lock until the case is revealed; off: they open (what is asked is recorded)."""
    return question_controls(questions_locked(page, bool(values["quiz"]), session_of(values).value.current))


@EVENTS.on(["route.load"], outputs=["case_list", "library_note", "round_day"], js=keys_js(),
           api_name="teaching_cases")  # fmt: skip
def list_cases(page: TeachingPage, values: dict) -> dict:
    import datetime

    import gradio as gr

    library = page.library()
    lines = [f"{len(library.cases)} cases in the library."] + [f"⚠️ {p}" for p in library.problems]
    return {
        "case_list": gr.update(choices=library.choices()),
        "library_note": "\n\n".join(lines),
        "round_day": f"**Round of {datetime.date.today().isoformat()}**",
    }


EVENTS.js("projector_layout", ["projector.click"], PROJECTOR_JS)
EVENTS.js("keys_help", ["keys_button.click", "help_close.click"], HELP_JS)


def session_ended(page: TeachingPage, state: object) -> None:
    """A closed tab (or an expired session): its running answer stops and its KV is freed."""
    if isinstance(state, SessionSlot) and isinstance(state.value, TeachingSession):
        leave_round(page, state.value, wait_s=0)


# --- the layout ----------------------------------------------------------------------------------------------------
def add_teaching_page(
    demo, service: InferenceSurface, uploads: UploadInbox, intake: FilmIntake, asking: Asking
) -> None:
    """Add the /teaching page to the app's Blocks (call after its `with gr.Blocks()` block, before queue())."""
    import gradio as gr

    from medgemma_xray.teaching.keys import ALL_LOBES

    settings = service.settings
    page = TeachingPage(service, intake, asking, uploads, ViewFiles(Path(uploads.folder)))
    ui: dict[str, Any] = {}
    with demo.route("Teaching rounds", "/teaching") as route:
        ui["route"] = route
        ui["session"] = gr.State(SessionSlot(TeachingSession()), delete_callback=lambda s: session_ended(page, s))
        page_style()
        gr.HTML(TEACH_STYLE, padding=False, container=False)
        gr.Markdown(
            "# Teaching rounds\n**For education and research only. Not a medical device and not for diagnosis.** "
            "Press ? for the viewer's keys; right- or middle-drag on the film to window.",
            elem_id="teach-header",
        )
        with gr.Row(elem_id="teach-top"):
            ui["case_list"] = gr.Dropdown([], label="Case library", elem_id="teach-case", scale=3)
            ui["open_button"] = gr.Button("Open case", elem_id="teach-open", scale=1)
            ui["shuffle_button"] = gr.Button("Shuffle (quiz order)", elem_id="teach-shuffle", scale=1)
            ui["next_button"] = gr.Button("Next case", elem_id="teach-next", scale=1)
            ui["practise_button"] = gr.Button("Practise my misses", elem_id="teach-practise", scale=1)
            ui["quiz"] = gr.Checkbox(True, label="Quiz: guess first, then reveal", elem_id="teach-quiz", scale=1)
            ui["projector"] = gr.Button("Projector layout (P)", elem_id="teach-projector", scale=1)
        with gr.Row(elem_classes="teach-engineering"):
            ui["student_name"] = gr.Textbox(
                label="Student (optional: shown here and in your exports, never sent to the logs)",
                max_length=80,
                elem_id="teach-student",
                scale=3,
            )
            ui["round_day"] = gr.Markdown(elem_id="teach-day")
        ui["library_note"] = gr.Markdown(elem_id="teach-library", elem_classes="teach-engineering")
        ui["order_note"] = gr.Markdown(elem_id="teach-order", elem_classes="teach-engineering")
        with gr.Row(elem_classes="teach-engineering"):
            ui["film_upload"] = gr.File(
                label="Or upload a film (DICOM, PNG, JPEG)", type="filepath", elem_id="teach-upload"
            )
            ui["key_upload"] = gr.File(label="Teacher's answer key (JSON)", type="filepath", elem_id="teach-key")
            ui["prior_upload"] = gr.File(
                label="Prior film for the uploaded film (optional)", type="filepath", elem_id="teach-prior-upload"
            )
        ui["case_info"] = gr.Markdown(elem_id="teach-case-info")
        with gr.Row(elem_id="teach-main-row"):
            with gr.Column(scale=1, min_width=170, elem_id="teach-tools"):
                _viewer_tools(ui)
            with gr.Column(scale=3, elem_id="teach-view-col"):
                ui["view"] = gr.Image(
                    label="Full-resolution film (click: the tool; right- or middle-drag: window)",
                    interactive=False,
                    type="filepath",
                    elem_id="teach-view",
                    show_label=True,
                    alt_text=VIEW_ALT,
                    buttons=["fullscreen"],  # no "share" (Spaces only), no download of a view file
                )
                _pointing_view_controls(ui)
            with gr.Column(scale=2):
                ui["model_view"] = gr.Image(
                    label="What the model sees (padded to square, 896 px)",
                    interactive=False,
                    type="pil",
                    format="png",
                    height=240,
                    alt_text="The film as the model sees it: grey-scale, padded to a square",
                    buttons=["fullscreen"],
                    elem_id="teach-model-view",
                )
                ui["chat"] = gr.Chatbot(
                    label="Questions", height=300, buttons=["copy", "copy_all"], elem_id="teach-chat"
                )  # (the default set has an unnamed icon button)
                with gr.Group(elem_id="teach-question-row"):
                    ui["question"] = gr.Textbox(label="Question", elem_id="teach-question")
                    ui["asked"] = gr.Textbox(label="Question", visible=False, elem_id="teach-asked")
                    with gr.Row():
                        ui["ask_button"] = gr.Button("Ask", variant="primary", elem_id="teach-ask")
                        ui["stop_button"] = gr.Button("Stop", variant="stop", elem_id="teach-stop")
                    ui["compare_button"] = gr.Button("What changed since the prior?", visible=False,
                                                     elem_id="teach-compare")  # fmt: skip
                    ui["compare_note"] = gr.Markdown(elem_id="teach-compare-note")
        with gr.Group(elem_id="teach-help"):
            gr.HTML(help_html(), padding=False, container=False)
            ui["help_close"] = gr.Button("Close (Esc)", elem_id="teach-help-close", size="sm")
        with gr.Accordion("Your read (before the reveal)", open=True, elem_classes="teach-form"):
            _read_form(ui, [""] + list(ALL_LOBES))
        with gr.Accordion("What changed since the prior? (your read, before the reveal)", open=True, visible=False,
                          elem_id="teach-change-read") as ui["change_group"]:  # fmt: skip
            _change_form(ui)
        ui["reveal_button"] = gr.Button("Reveal", variant="primary", elem_id="teach-reveal")
        ui["mark_score"] = gr.Markdown(elem_id="teach-mark-score", elem_classes="teach-after")
        with gr.Row(elem_classes="teach-after"):
            ui["student_score"] = gr.Markdown(elem_id="teach-student-score")
            ui["model_score"] = gr.Markdown(elem_id="teach-model-score")
        ui["reveal_box"] = gr.Markdown(elem_id="teach-reveal-box", elem_classes="teach-after")
        ui["change_box"] = gr.Markdown(elem_id="teach-change-box", elem_classes="teach-after")
        with gr.Accordion("Report: indication, comparison, recommendation; Markdown and DICOM SR", open=False,
                          elem_classes="teach-after"):  # fmt: skip
            ui["indication"] = gr.Textbox(label="Indication", elem_id="teach-indication")
            ui["comparison"] = gr.Textbox(label="Comparison", elem_id="teach-comparison")
            ui["recommendation"] = gr.Textbox(label="Recommendation", elem_id="teach-recommendation")
            ui["identifiers"] = gr.Checkbox(
                False,
                label="Include the source film's patient and study in the SR (only a DICOM film that has them)",
                interactive=settings.sr_include_identifiers,
                info=None if settings.sr_include_identifiers else "Off: the operator has not allowed identifiers.",
                elem_id="teach-sr-identifiers",
            )
            ui["report_button"] = gr.Button("Make the report", elem_id="teach-report")
            with gr.Row():
                ui["report_md"] = gr.DownloadButton("Report (Markdown)", visible=False, elem_id="teach-report-md")
                ui["report_sr"] = gr.DownloadButton("Report (DICOM SR)", visible=False, elem_id="teach-report-sr")
            with gr.Row():
                ui["marks_sr_button"] = gr.Button("Marks as DICOM SR (TID 1500)", elem_id="teach-marks-sr-make")
                ui["marks_sr"] = gr.DownloadButton("Marks (DICOM SR)", visible=False, elem_id="teach-marks-sr")
        ui["export_button"] = gr.Button(
            "Export the session (CSV and PDF)", elem_id="teach-export", elem_classes="teach-after"
        )
        with gr.Row(elem_classes="teach-after"):
            ui["session_csv"] = gr.DownloadButton("Session (CSV)", visible=False, elem_id="teach-csv")
            ui["session_pdf"] = gr.DownloadButton("Session handout (PDF)", visible=False, elem_id="teach-pdf")
        concurrency = {"generation": settings.generation_concurrency}
        for events in (EVENTS, teaching_view.EVENTS, teaching_answers.EVENTS, teaching_exports.EVENTS,
                       teaching_marks.EVENTS, teaching_compare.EVENTS, teaching_practice.EVENTS):  # fmt: skip
            events.wire(ui, page, concurrency=concurrency)


def _viewer_tools(ui: dict[str, Any]) -> None:
    """The viewer's tools, beside the film (no scrolling to reach them): presets, invert, zoom, reset, a typed
    window (Enter applies it), the tool, the keys' list and the measurement."""
    import gradio as gr

    with gr.Row():
        ui["lung_button"] = gr.Button("Lung (1)", elem_id="teach-lung", size="sm", min_width=70)
        ui["mediastinum_button"] = gr.Button("Mediast. (2)", elem_id="teach-mediastinum", size="sm", min_width=70)
    with gr.Row():
        ui["bone_button"] = gr.Button("Bone (3)", elem_id="teach-bone", size="sm", min_width=70)
        ui["file_button"] = gr.Button("File (0)", elem_id="teach-file-window", size="sm", min_width=70)
    with gr.Row():
        ui["invert_button"] = gr.Button("Invert (I)", elem_id="teach-invert", size="sm", min_width=70)
        ui["reset_button"] = gr.Button("Reset (R)", elem_id="teach-reset", size="sm", min_width=70)
    with gr.Row():
        ui["zoom_in"] = gr.Button("Zoom + (+)", elem_id="teach-zoom-in", size="sm", min_width=70)
        ui["zoom_out"] = gr.Button("Zoom − (−)", elem_id="teach-zoom-out", size="sm", min_width=70)
    ui["centre"] = gr.Number(label="Level (Enter applies)", elem_id="teach-level")
    ui["width"] = gr.Number(label="Width (Enter applies)", elem_id="teach-width")
    ui["apply_window"] = gr.Button("Apply the window", elem_id="teach-apply-window", elem_classes="teach-hidden")
    ui["tool"] = gr.Radio(
        [
            ("Ruler (L)", "ruler"),
            ("CTR calliper (C)", "ctr"),
            ("Pan (M)", "pan"),
            ("Probe (V)", "probe"),
            ("Mark (K)", "mark"),
        ],  # fmt: skip
        value="ruler",
        label="Tool",
        elem_id="teach-tool",
    )
    ui["measure"] = gr.Markdown(elem_id="teach-measure")
    ui["keys_button"] = gr.Button("Keys (?)", elem_id="teach-keys", size="sm")
    _pointing_tools(ui)


def _pointing_tools(ui: dict[str, Any]) -> None:
    """The Mark tool's finding and shape, the student's marks (each removable until Reveal) and Where?."""
    import gradio as gr

    ui["mark_finding"] = gr.Dropdown(
        teaching_marks.mark_choices(), value=None, allow_custom_value=True, label="Finding (pick or type)",
        elem_id="teach-mark-finding",
    )  # fmt: skip
    ui["mark_shape"] = gr.Radio(
        [("Point", "point"), ("Box (2 corners)", "box")], value="box", label="Mark as", elem_id="teach-mark-shape"
    )
    ui["mark_list"] = gr.Radio([], label="Your marks (pick one to remove it)", elem_id="teach-mark-list")
    ui["mark_remove"] = gr.Button("Remove the mark", elem_id="teach-mark-remove", size="sm")
    ui["where_button"] = gr.Button("Where? (the model points)", elem_id="teach-where", size="sm")
    ui["where_asked"] = gr.Textbox(visible=False, elem_id="teach-where-asked")


def _pointing_view_controls(ui: dict[str, Any]) -> None:
    """Under the film: which overlays show, their legend in words, and what the model's Where? found."""
    import gradio as gr

    from medgemma_xray.teaching.marks import LAYERS

    ui["overlay_toggle"] = gr.CheckboxGroup(
        teaching_marks.overlay_choices(), value=list(LAYERS), label="Show on the film", elem_id="teach-overlays"
    )
    ui["overlay_legend"] = gr.Markdown(elem_id="teach-legend")
    ui["where_note"] = gr.Markdown(elem_id="teach-where-note")


def _read_form(ui: dict[str, Any], lobes: list[str]) -> None:
    """The student's read: one component per FORM_DEFAULTS name, elem_id read-* (the browser tests use them)."""
    import gradio as gr

    def choice(name: str, choices: list[str], label: str) -> None:
        ui[name] = gr.Dropdown(choices, value="", label=label, elem_id=name.replace("_", "-"))

    def number(name: str, label: str) -> None:
        ui[name] = gr.Number(None, label=label, elem_id=name.replace("_", "-"))

    def box(name: str, label: str) -> None:
        ui[name] = gr.Checkbox(label=label, elem_id=name.replace("_", "-"))

    with gr.Row():
        box("read_effusion", "Pleural effusion")
        choice("read_effusion_side", FINDING_CHOICES["effusion_side"], "side")
        choice("read_effusion_size", FINDING_CHOICES["effusion_size"], "size")
        box("read_pneumothorax", "Pneumothorax")
        choice("read_pneumothorax_side", FINDING_CHOICES["side"], "side")
        choice("read_pneumothorax_size", FINDING_CHOICES["pneumothorax_size"], "size")
    with gr.Row():
        box("read_nodule", "Nodule or mass")
        choice("read_nodule_lobe", lobes, "lobe")
        number("read_nodule_size", "size (cm)")
        box("read_consolidation", "Consolidation")
        choice("read_consolidation_lobe", lobes, "lobe")
    with gr.Row():
        box("read_cardiomegaly", "Cardiomegaly")
        number("read_ctr", "cardiothoracic ratio")
        box("read_ett", "ET tube")
        number("read_ett_tip", "tip above carina (cm)")
        box("read_pacemaker", "Pacemaker")
        choice("read_pacemaker_side", FINDING_CHOICES["side"], "side")
    with gr.Row():
        box("read_line", "Central line")
        choice("read_line_route", ["", "right internal jugular", "left subclavian"], "route")
        choice("read_line_tip", ["", "superior vena cava", "cavoatrial junction", "right atrium"], "tip")
        choice("read_rotated", FINDING_CHOICES["yes_no"], "rotated")
        choice("read_inspiration", FINDING_CHOICES["inspiration"], "inspiration")
        choice("read_exposure", FINDING_CHOICES["exposure"], "exposure")
    box("read_rest_absent", "Every finding I did not tick is absent (else unticked findings are not assessed)")
    ui["read_notes"] = gr.Textbox(label="Free text", lines=2, elem_id="read-notes")


def _change_form(ui: dict[str, Any]) -> None:
    """The change read: per finding, how it changed since the prior (elem_id change-<finding>); empty: no change
    claimed (teaching/change_scoring.py)."""
    import gradio as gr

    from medgemma_xray.teaching.change_scoring import change_kinds
    from medgemma_xray.web.teaching_context import CHANGE_FORM

    kinds = ["", *change_kinds()]
    with gr.Row():
        for name in CHANGE_FORM:
            label = name.removeprefix("change_").replace("_", " ")
            ui[name] = gr.Dropdown(kinds, value="", label=label, elem_id=name.replace("_", "-"), min_width=120)
