"""The main page (/): upload a film, ask about it over several turns, write a structured report.

Layout in build_main_page; each handler is a module-level function declared with the events that run it
(web.page_wiring). The model lives behind serving.surface.InferenceSurface, films come through web's one intake
(medgemma_xray.intake), questions through web.asking.

An answer belongs to the case it started on. The session's State holds one SessionSlot (web.page_session): ×, a
new upload, New case, the chat's clear and a closed tab end the running answer or report (its decode slot is freed),
and a stream writes into the session only while it still holds the case the stream started on.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from medgemma_xray.assistant.case import EXAMPLE_QUESTIONS, Case
from medgemma_xray.assistant.film_notes import film_notes_markdown
from medgemma_xray.engine_bundle.defaults import DEMO_NOTICE
from medgemma_xray.engine_bundle.gate import gate_summary
from medgemma_xray.web.asking import client_key
from medgemma_xray.web.page_errors import refused, shown
from medgemma_xray.web.page_session import SessionSlot
from medgemma_xray.web.page_style import page_style
from medgemma_xray.web.page_wiring import PageEvents

if TYPE_CHECKING:
    from medgemma_xray.intake import FilmIntake
    from medgemma_xray.serving.settings import Settings
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.asking import Asking
    from medgemma_xray.web.upload_cache import UploadInbox

logger = logging.getLogger("app")  # the operator-facing name the log has always used

DISCLAIMER = (
    "**For education and research only. Not a medical device and not for diagnosis.** "
    "Answers can be wrong; a qualified radiologist must read every film."
)
PREVIEW_SIZE = 896  # the processor's input size: the preview is exactly what the model sees
PREVIEW_ALT = "The uploaded chest film as the model sees it: grey-scale, padded to a square"
ANSWER_STOPPED = "*Stopped. Ask again or ask another question.*"
REPORT_STOPPED = "*Stopped before the report was complete. Press Structured report to write it again.*"
NO_FILM = "Upload a chest X-ray first, then ask about it."
END_WAIT_S = 10.0  # how long clearing a case waits for its running answer to end (one token, normally)
# After an answer has streamed, bring its first line into view (on a phone the chat box starts below the fold).
SHOW_LAST_ANSWER_JS = """
() => {
  const answers = document.querySelectorAll('#chat .bot');
  const last = answers[answers.length - 1];
  if (last) last.scrollIntoView({block: 'start'});
}
"""
SHOW_REPORT_JS = "() => { document.querySelector('#report-box')?.scrollIntoView({block: 'start'}); }"
EVENTS = PageEvents()
HIDDEN: dict[str, Any] = {"value": None, "visible": False}


@dataclass
class MainPage:
    """What the handlers use: made once per server by build_main_page."""

    service: InferenceSurface
    intake: FilmIntake
    asking: Asking
    uploads: UploadInbox

    @property
    def settings(self) -> Settings:
        return self.service.settings


def badge_markdown(service: InferenceSurface) -> str:
    info = service.info()
    if info is None:
        return "Model: loading..."
    text = (
        f"**Mode:** {info.mode_label} &nbsp; **Precision:** {info.precision.upper()} &nbsp; "
        f"**Executor:** {info.executor} &nbsp; **Device:** {info.device} &nbsp; **Model:** {info.model_id}"
    )
    if info.checkpoint_kind and not info.is_demo:  # which MedGemma, or that it is neither (checkpoint profile)
        text += f" ({info.checkpoint_kind})"
    gate = gate_summary((info.details or {}).get("accuracy"))
    if gate:
        text += f"\n\n{'⚠️ ' if 'LOWERED' in gate else ''}**Accuracy gate:** {gate}"
    breaker = service.status(brief=True)["breaker"]
    if breaker["state"] == "open":
        text += (
            f"\n\n⚠️ **Engine bundle disabled by the circuit breaker** ({breaker['last_failure']}); serving on PyTorch."
        )
    if info.is_demo:
        notice = info.demo_notice or DEMO_NOTICE
        text += f"\n\n⚠️ **{notice}** Set MODEL_PATH to a local MedGemma for real films."
    return text


def _session(values: dict) -> SessionSlot[Case]:
    state = values["session"]
    if isinstance(state, SessionSlot) and isinstance(state.value, Case):
        return state
    return SessionSlot(Case())  # a client that sent a value of its own for the State: a session of its own


def _active(case: Case) -> bool:
    return case.has_film


def _hidden():
    import gradio as gr

    return gr.update(**HIDDEN)


def _end_case(page: MainPage, session: SessionSlot[Case], case: Case, wait_s: float = END_WAIT_S) -> None:
    """The case leaves the screen: its running answer or report stops (and writes nothing more; the screen's reply
    waits for its stream to end, so no last update of it lands after the reply), its KV is freed, and its report
    files go."""
    from medgemma_xray.assistant.report_export import remove_report_files

    page.asking.end_conversation(case.conversation_id, wait_s=wait_s)
    page.service.forget_conversation(case.conversation_id)
    remove_report_files(session.exports)
    session.exports = None


def _cleared_screen() -> dict[str, Any]:
    return {
        "preview": None,
        "notes": "",
        "chat": [],
        "report_box": "",
        "report_json": _hidden(),
        "report_md": _hidden(),
    }


# --- the film -------------------------------------------------------------------------------------------------------
CLEARED = ["preview", "notes", "chat", "report_box", "report_json", "report_md", "session"]


# Queued (never limited), as the answers are: the screen's replies and an answer's updates share one event
# stream, so they reach the browser in the order they were sent.
@EVENTS.on(["upload.upload"], inputs=["session"], outputs=CLEARED, concurrency_limit=None)
def clear_before_upload(page: MainPage, values: dict) -> dict:
    """The screen and the model's state are cleared first, so a failed upload leaves no film active."""
    return clear_case(page, values)


@EVENTS.on(["upload.clear"], inputs=["session"], outputs=CLEARED, concurrency_limit=None, api_name="clear_film")
def clear_case(page: MainPage, values: dict) -> dict:
    """Clearing the upload clears the case: film, conversation, its cached KV, the last report."""
    session = _session(values)
    old = session.value
    _end_case(page, session, old)
    session.set(old.cleared())
    return {**_cleared_screen(), "session": session}


@EVENTS.on(
    ["clear_before_upload.then"],
    inputs=["upload", "session"],
    outputs=["preview", "notes", "chat", "report_box", "session"],
    api_name="upload_film",
)
def load_film(page: MainPage, values: dict) -> dict:
    session = _session(values)
    old = session.value
    _end_case(page, session, old)  # an API client's upload_film replaces the case without the clear step
    session.set(old.cleared())  # the old film is gone whether or not the new one loads
    file_path = values["upload"]
    if not file_path:
        raise refused("No file received. Drop a chest X-ray (DICOM, PNG or JPEG) onto the upload box.", logger)
    try:
        data = page.uploads.take(file_path)  # the upload is deleted from disk here, before decoding
        film = page.intake.read(data)
    except Exception as exc:
        raise shown(exc, logger) from exc
    session.set(old.cleared().with_film(film.film, film.model_image, film.image_key))
    preview = film.model_image.copy()  # already PREVIEW_SIZE square: the model's own input
    # Gradio caches images under a hash of their bytes and rewrites that file on every save, so two users
    # uploading the same film (common on teaching rounds) could be served a half-written preview. A unique PNG
    # text chunk gives each upload its own cache file.
    preview.info["upload"] = uuid.uuid4().hex
    # Warnings appear once, in the notes (not also as toasts, which stacked on repeated uploads).
    notes = film_notes_markdown(film.film, page.service.info(), film.warnings, shape=film.full_shape)
    page.service.prepare_film(film.model_image)  # the vision tower's input made now, not in the first question
    return {"preview": preview, "notes": notes, "chat": [], "report_box": "", "session": session}


# --- questions -----------------------------------------------------------------------------------------------------
def _question_request(page: MainPage, case: Case, question: str):
    from medgemma_xray.web.asking import AskRefused

    if not _active(case):
        raise refused(NO_FILM, logger)
    if not question:
        raise refused("Type a question (or pick an example) before asking.", logger)
    request = case.ask(question, page.settings.max_new_tokens)
    try:
        page.asking.check(request)
    except AskRefused as exc:
        raise shown(exc, logger) from exc
    return request


@EVENTS.on(
    ["ask_button.click", "question.submit"], inputs=["question", "session"], outputs=["asked"], concurrency_limit=None
)
def take_question(page: MainPage, values: dict) -> dict:
    """Checked before it waits for a decode slot (its own queue step, never limited, so a refusal comes at once and
    shows as the queue's error toast): no film, no question, a rule broken, or an answer still running in this
    conversation is refused with a message, and the Question box keeps the text."""
    from medgemma_xray.web.asking import WAIT_MESSAGE

    question = (values["question"] or "").strip()
    case = _session(values).value
    _question_request(page, case, question)
    if page.asking.is_answering(case.conversation_id):
        raise refused(WAIT_MESSAGE, logger)
    return {"asked": question}


@EVENTS.on(["take_question.success"], outputs=["question", "case_tabs"], queue=False)
def clear_question(page: MainPage, values: dict) -> dict:
    """The Question box is cleared once, when the question is taken; what is typed while it is answered stays."""
    import gradio as gr

    return {"question": "", "case_tabs": gr.Tabs(selected="conversation")}


@EVENTS.on(
    ["clear_question.success"],
    inputs=["asked", "session"],
    outputs=["chat", "asked", "session"],  # "asked" keeps the API's (chat, question) pair of outputs
    request=True,
    api_name="ask",
    concurrency_id="generation",
)
def answer(page: MainPage, values: dict, request) -> Any:
    from medgemma_xray.assistant.answer_details import answer_details_markdown
    from medgemma_xray.assistant.question_scope import confidence_withheld
    from medgemma_xray.inference_api.types import GenerationStats

    session = _session(values)
    case = session.value
    question = (values["asked"] or "").strip()
    generation = _question_request(page, case, question)
    try:
        page.asking.admit(client_key(request))
        ticket = page.asking.claim(case.conversation_id)
    except Exception as exc:
        raise shown(exc, logger) from exc
    session.answer_token = ticket.stop_token
    history = case.chat_messages() + [{"role": "user", "content": question}]
    text, stats = "", GenerationStats()
    try:
        yield {"chat": history + [{"role": "assistant", "content": ""}]}  # the question shows at once
        for text in page.asking.stream(generation, ticket, stats):
            if ticket.superseded:
                return
            yield {"chat": history + [{"role": "assistant", "content": text}]}
        if ticket.superseded:  # the film, case or conversation changed: this answer writes nothing more
            return
        details = answer_details_markdown(stats, withheld=confidence_withheld(question))
        if ticket.stopped.is_set():
            details = f"{ANSWER_STOPPED}\n\n{details}" if stats.new_tokens else ANSWER_STOPPED
        updated = case.answered(question, text, details)
        if session.replace_if(case, updated):
            yield {"chat": updated.chat_messages(), "asked": "", "session": session}
    except Exception as exc:
        raise shown(exc, logger) from exc
    finally:
        page.asking.release(ticket)
        if session.answer_token == ticket.stop_token:
            session.answer_token = None


EVENTS.js("show_last_answer", ["answer.then"], SHOW_LAST_ANSWER_JS)


@EVENTS.on(["stop_button.click"], inputs=["session"], queue=False, api_name="stop")
def stop(page: MainPage, values: dict) -> dict:
    """Stop: this session's running answer or report ends at its next piece of text, keeping what it said."""
    page.asking.stop(_session(values).answer_token)
    return {}


@EVENTS.on(["chat.clear"], inputs=["session"], outputs=["session"], concurrency_limit=None, api_name="clear_chat")
def new_conversation(page: MainPage, values: dict) -> dict:
    """The chat's clear (trash) icon: the same film, a fresh conversation; the old one's answer stops and its KV
    is freed."""
    session = _session(values)
    case = session.value
    page.asking.end_conversation(case.conversation_id, wait_s=END_WAIT_S)
    page.service.forget_conversation(case.conversation_id)
    session.replace_if(case, case.new_conversation())
    return {"session": session}


# --- the report ----------------------------------------------------------------------------------------------------
EVENTS.js("show_report_tab", ["report_button.click"], SHOW_REPORT_JS, queue=False)


@EVENTS.on(["show_report_tab.then"], outputs=["case_tabs"], queue=False)
def select_report_tab(page: MainPage, values: dict) -> dict:
    import gradio as gr

    return {"case_tabs": gr.Tabs(selected="report-tab")}


@EVENTS.on(
    ["select_report_tab.then"],
    inputs=["session"],
    outputs=["report_box", "report_json", "report_md", "session"],
    request=True,
    api_name="report",
    concurrency_id="generation",
)
def report(page: MainPage, values: dict, request) -> Any:
    """Stream the model's report text, then show it parsed into the schema with confidence, and offer both
    exports, named by date, report id and the film's label."""
    import gradio as gr

    from medgemma_xray.assistant.answer_details import answer_metadata
    from medgemma_xray.assistant.report import parse_report, report_request
    from medgemma_xray.assistant.report_export import (
        export_stem,
        remove_report_files,
        report_markdown,
        write_report_files,
    )
    from medgemma_xray.inference_api.types import GenerationStats

    session = _session(values)
    case = session.value
    if not _active(case):
        raise refused("Upload a chest X-ray first, then ask for a report.", logger)
    try:
        page.asking.admit(client_key(request))
        ticket = page.asking.claim(case.conversation_id)
    except Exception as exc:
        raise shown(exc, logger) from exc
    session.answer_token = ticket.stop_token
    remove_report_files(session.exports)
    session.exports = None
    generation = replace(report_request(case.model_image, page.settings.max_new_tokens), image_key=case.image_key)
    text, stats = "", GenerationStats()
    try:
        yield {"report_box": "*Writing the report…*", "report_json": _hidden(), "report_md": _hidden()}
        for text in page.asking.stream(generation, ticket, stats):
            if ticket.superseded:
                return
            yield {"report_box": text}
        if ticket.superseded:
            return
        if ticket.stopped.is_set():
            yield {"report_box": f"{text}\n\n{REPORT_STOPPED}"}
            return
        parsed = parse_report(text, stats)
        report_id = uuid.uuid4().hex[:4]
        info = page.service.info()
        metadata = {
            "report_id": report_id,
            "film": case.film_label,
            "model": info.model_id if info else None,
            "executor": info.executor if info else None,
            "source": case.film.source if case.film is not None else "",
            **answer_metadata(stats),
        }
        files = write_report_files(
            parsed, base_dir=page.uploads.folder, metadata=metadata, stem=export_stem(report_id, case.film_label)
        )
        if session.value is not case:  # the case changed while the files were written: they are not its report
            remove_report_files(files)
            return
        session.exports = files
        yield {
            "report_box": report_markdown(parsed, metadata),
            "report_json": gr.update(value=str(files.json_path), visible=True),
            "report_md": gr.update(value=str(files.markdown_path), visible=True),
            "session": session,
        }
    except Exception as exc:
        raise shown(exc, logger) from exc
    finally:
        page.asking.release(ticket)
        if session.answer_token == ticket.stop_token:
            session.answer_token = None


# --- the case as a whole -----------------------------------------------------------------------------------------
# (the outputs in the order API clients have always had them: upload, preview, notes, chat, question, report, ...)
@EVENTS.on(["new_case_button.click"], inputs=["session"], concurrency_limit=None, api_name="new_case",
           outputs=["upload", "preview", "notes", "chat", "question", "report_box", "report_json", "report_md",
                    "session"])  # fmt: skip
def new_case(page: MainPage, values: dict) -> dict:
    return {**clear_case(page, values), "upload": None, "question": ""}


@EVENTS.on(["examples.click"], inputs=["examples"], outputs=["question"], queue=False, api_name="load_example")
def load_example(page: MainPage, values: dict) -> dict:
    """An example question into the Question box. Any index a client sends gets a clear answer, never an
    IndexError (gr.Examples indexed its list with whatever arrived)."""
    index = values["examples"]
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(EXAMPLE_QUESTIONS):
        raise refused(
            f"There is no example question {str(index)[:20]}; pick one of the {len(EXAMPLE_QUESTIONS)} shown "
            f"(0 to {len(EXAMPLE_QUESTIONS) - 1}).",
            logger,
        )
    return {"question": EXAMPLE_QUESTIONS[index]}


@EVENTS.on(["blocks.load"], outputs=["badge"], api_name="model_badge")
def show_badge(page: MainPage, values: dict) -> dict:
    return {"badge": badge_markdown(page.service)}


@EVENTS.on(["badge_timer.tick"], outputs=["badge"])
def refresh_badge(page: MainPage, values: dict) -> dict:
    return {"badge": badge_markdown(page.service)}


def session_ended(page: MainPage, state: object) -> None:
    """A closed tab (or an expired session): its running answer stops, its KV and report files go."""
    if isinstance(state, SessionSlot) and isinstance(state.value, Case):
        _end_case(page, state, state.value, wait_s=0)  # nothing is left on screen to keep in order


# --- the layout ----------------------------------------------------------------------------------------------------
def build_main_page(service: InferenceSurface, uploads: UploadInbox, intake: FilmIntake, asking: Asking):
    """The main page's Blocks. uploads: the web.upload_cache.UploadInbox that reads (and deletes) each upload once."""
    import gradio as gr

    page = MainPage(service, intake, asking, uploads)
    settings = service.settings
    max_age = settings.cache_max_age_s  # previews and never-read uploads: deleted within 1.5x this
    ui: dict[str, Any] = {}
    with gr.Blocks(
        title="MedGemma X-Ray assistant", delete_cache=(max(1, max_age // 2), max_age), analytics_enabled=False
    ) as demo:
        ui["blocks"] = demo
        ui["session"] = gr.State(SessionSlot(Case()), delete_callback=lambda state: session_ended(page, state))
        page_style()
        gr.Markdown("# MedGemma X-Ray assistant\n" + DISCLAIMER)
        ui["badge"] = gr.Markdown(badge_markdown(service), elem_id="model-badge")
        with gr.Row():
            # --- the film: upload, what the model sees, its notes ---
            with gr.Column(scale=2):
                ui["upload"] = gr.File(
                    label="Chest X-ray (PA): DICOM, PNG or JPEG", type="filepath", elem_id="film-upload"
                )
                ui["preview"] = gr.Image(
                    label="What the model sees (padded to square, 896 px)",
                    interactive=False,
                    type="pil",
                    format="png",
                    height=360,
                    alt_text=PREVIEW_ALT,
                    buttons=["fullscreen"],  # no "share" (Spaces only) and no download of a deleted upload
                    elem_id="film-preview",
                )
                ui["notes"] = gr.Markdown(elem_id="film-notes")
            # --- the case: conversation and report, side by side in tabs ---
            with gr.Column(scale=3):
                with gr.Tabs(elem_id="case-tabs") as case_tabs:
                    ui["case_tabs"] = case_tabs
                    with gr.Tab("Conversation", id="conversation"):
                        ui["chat"] = gr.Chatbot(
                            label="Conversation", height=420, buttons=["copy", "copy_all"], elem_id="chat"
                        )
                    with gr.Tab("Report", id="report-tab"):
                        ui["report_box"] = gr.Markdown(elem_id="report-box")
                        with gr.Row():
                            ui["report_json"] = gr.DownloadButton(
                                "Download report (JSON)", visible=False, elem_id="report-json"
                            )
                            ui["report_md"] = gr.DownloadButton(
                                "Download report (Markdown)", visible=False, elem_id="report-md"
                            )
                ui["question"] = gr.Textbox(label="Question", placeholder="Ask about the film...", elem_id="question")
                # The question being answered: filled from the Question box when it is taken (an API client sends
                # it here directly), so the box itself is free for the next one while the answer streams.
                ui["asked"] = gr.Textbox(label="Question", visible=False, elem_id="asked")
                with gr.Row():
                    ui["ask_button"] = gr.Button("Ask", variant="primary", elem_id="ask")
                    ui["stop_button"] = gr.Button("Stop", variant="stop", elem_id="stop")
                    ui["report_button"] = gr.Button("Structured report", elem_id="report")
                    ui["new_case_button"] = gr.Button("New case", elem_id="new-case")
                ui["examples"] = gr.Dataset(
                    components=[ui["question"]],
                    samples=[[q] for q in EXAMPLE_QUESTIONS],
                    type="index",  # the handler checks the index: a client may send any number
                    label="Teaching-round questions",
                    elem_id="examples",
                )
        ui["badge_timer"] = gr.Timer(5.0)
        EVENTS.wire(ui, page, concurrency={"generation": settings.generation_concurrency})
    return demo
