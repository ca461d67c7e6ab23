"""The main page (/): upload a film, ask about it over several turns, write a structured report.

Layout and thin handlers only: the model lives behind serving.surface.InferenceSurface, image input in xray_io.
web.app puts this page and the teaching page together; web.http_server serves them.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from typing import TYPE_CHECKING

from medgemma_xray.assistant.case import EXAMPLE_QUESTIONS, Case, ClosedConversations, compact_film
from medgemma_xray.assistant.film_notes import film_notes_markdown
from medgemma_xray.engine_bundle.defaults import DEMO_NOTICE
from medgemma_xray.web.limits import RequestLimits
from medgemma_xray.xray_io import ImageInputError, load_radiograph

if TYPE_CHECKING:
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.upload_cache import UploadInbox

logger = logging.getLogger("app")  # the operator-facing name the log has always used

DISCLAIMER = (
    "**For education and research only. Not a medical device and not for diagnosis.** "
    "Answers can be wrong; a qualified radiologist must read every film."
)
PREVIEW_SIZE = 896  # the processor's input size: the preview is exactly what the model sees
PREVIEW_ALT = "The uploaded chest film as the model sees it: grey-scale, padded to a square"
# Styles the theme lacks: the Ask button's text at >= 4.5:1 contrast (the theme's orange gives 2.8:1), and no
# download link on the upload's chip (the upload is deleted once read, so that link could only answer 403).
PAGE_CSS = """
#ask, #ask:hover { background: #9a3412; border-color: #9a3412; color: #ffffff; }
#case-tabs button[role="tab"][aria-selected="true"] { color: #9a3412; }
footer .show-api, footer .built-with, footer .settings { color: #4b5563; }
a[data-sveltekit-reload] { color: #374151 !important; }  /* the page links (main, /teaching) Gradio draws on top */
#film-upload td.download { display: none; }
.answer-details summary { cursor: pointer; }
"""
# After an answer has streamed, bring its first line into view (on a phone the chat box starts below the fold).
SHOW_LAST_ANSWER_JS = """
() => {
  const answers = document.querySelectorAll('#chat .bot');
  const last = answers[answers.length - 1];
  if (last) last.scrollIntoView({block: 'start'});
}
"""
SHOW_REPORT_JS = "() => { document.querySelector('#report-box')?.scrollIntoView({block: 'start'}); }"


def badge_markdown(service: InferenceSurface) -> str:
    info = service.info()
    if info is None:
        return "Model: loading..."
    text = (
        f"**Mode:** {info.mode_label} &nbsp; **Precision:** {info.precision.upper()} &nbsp; "
        f"**Executor:** {info.executor} &nbsp; **Device:** {info.device} &nbsp; **Model:** {info.model_id}"
    )
    breaker = service.status(brief=True)["breaker"]
    if breaker["state"] == "open":
        text += (
            f"\n\n⚠️ **Engine bundle disabled by the circuit breaker** ({breaker['last_failure']}); serving on PyTorch."
        )
    if info.is_demo:
        notice = info.demo_notice or DEMO_NOTICE
        text += f"\n\n⚠️ **{notice}** Set MODEL_PATH to a local MedGemma for real films."
    return text


def build_main_page(service: InferenceSurface, uploads: UploadInbox):
    """The main page's Blocks. uploads: the web.upload_cache.UploadInbox that reads (and deletes) each upload once."""
    import gradio as gr

    from medgemma_xray.assistant.answer_details import answer_details_markdown, answer_metadata
    from medgemma_xray.assistant.report import parse_report, report_request
    from medgemma_xray.assistant.report_export import (
        export_stem,
        remove_report_files,
        report_markdown,
        write_report_files,
    )
    from medgemma_xray.film_check import NotAChestFilmError, check_film, load_reference
    from medgemma_xray.film_check.check import REFERENCE_PATH
    from medgemma_xray.inference_api.errors import RequestError
    from medgemma_xray.inference_api.types import GenerationStats
    from medgemma_xray.serving.service import ServiceUnavailable
    from medgemma_xray.web.answer_lock import AnswerLocks
    from medgemma_xray.web.upload_cache import NotAnUploadError, UploadGoneError

    settings = service.settings
    closed = ClosedConversations()  # cases whose film was replaced, even where the replacement failed
    film_reference = (
        None if settings.film_check == "off" else load_reference(settings.film_check_reference or REFERENCE_PATH)
    )
    max_tokens = settings.max_new_tokens
    limits = RequestLimits.from_settings(settings)
    answering = AnswerLocks()

    # Logs get the error's class only, never its message or a traceback: messages about a file are shown to its
    # uploader, and file names (which may hold patient names) appear in exception texts.
    def user_error(exc: Exception) -> gr.Error:
        logger.warning("user error: %s", type(exc).__name__)
        return gr.Error(str(exc), duration=None, print_exception=False)

    def refused(message: str) -> gr.Error:  # a fixed text of ours: the kind is logged, not the message
        logger.warning("user error: incomplete request")
        return gr.Error(message, print_exception=False)

    def internal_error(exc: Exception) -> gr.Error:
        incident = uuid.uuid4().hex[:8]
        frames = "".join(traceback.format_tb(exc.__traceback__))  # where it failed, without the message
        logger.error("internal error %s: %s\n%s", incident, type(exc).__name__, frames.rstrip())
        return gr.Error(
            f"Internal error (incident {incident}); the server is still running. Try again; if it happens again, "
            "give the incident number to the operator.",
            print_exception=False,
        )

    def clear_case(case: Case, exports):
        """Empty the screen and the model's state before anything else: a failed upload must leave no film active,
        and clearing the upload clears the case (film, conversation, its cached KV, the last report)."""
        if isinstance(case, Case):
            service.forget_conversation(case.conversation_id)
        remove_report_files(exports)
        hidden = gr.update(value=None, visible=False)
        cleared = case.cleared() if isinstance(case, Case) else Case()
        return None, "", [], "", cleared, hidden, hidden, None

    def active(case: Case) -> bool:
        return isinstance(case, Case) and case.has_film and case.conversation_id not in closed

    def load_film(file_path: str | None, case: Case):
        if isinstance(case, Case):
            closed.close(case.conversation_id)  # the old film is gone whether or not the new one loads
            service.forget_conversation(case.conversation_id)  # a new film starts a new conversation
        if not file_path:
            raise refused("No file received. Drop a chest X-ray (DICOM, PNG or JPEG) onto the upload box.")
        extra_warnings: tuple[str, ...] = ()
        try:
            data = uploads.take(file_path)  # the upload is deleted from disk here, before decoding
            film = load_radiograph(data, max_pixels=settings.max_pixels, max_bytes=settings.max_file_size_bytes)
            kept_film, image = compact_film(film)  # the 896-px model input and a small copy, not the film
            if film_reference is not None:
                verdict = check_film(film.pixels, film_reference)
                if not verdict.plausible and settings.film_check == "refuse":
                    raise NotAChestFilmError(verdict.refusal())
                if not verdict.plausible:
                    extra_warnings = (verdict.warning(),)
        except (ImageInputError, NotAnUploadError, UploadGoneError) as exc:
            raise user_error(exc) from exc
        except Exception as exc:
            raise internal_error(exc) from exc
        preview = image.copy()  # already PREVIEW_SIZE square: the model's own input
        # Gradio caches images under a hash of their bytes and rewrites that file on every save, so two users
        # uploading the same film (common on teaching rounds) could be served a half-written preview. A unique
        # PNG text chunk gives each upload its own cache file.
        preview.info["upload"] = uuid.uuid4().hex
        # Warnings appear once, in the notes (not also as toasts, which stacked on repeated uploads).
        notes = film_notes_markdown(film, service.info(), extra_warnings)
        loaded = (case if isinstance(case, Case) else Case()).with_film(kept_film, image)
        service.prepare_film(image)  # the vision tower's input made now, not inside the first question's wait
        return preview, notes, [], "", loaded

    def ask(question: str, case: Case):
        question = (question or "").strip()
        if not active(case):
            raise refused("Upload a chest X-ray first, then ask about it.")
        if not question:
            raise refused("Type a question (or pick an example) before asking.")
        history = case.chat_messages() + [{"role": "user", "content": question}]
        answer, stats = "", GenerationStats()
        try:
            limits.check_question(len(case.turns) // 2, question)
            with answering.hold(case.conversation_id):  # a second question while one streams: "wait"
                for answer in service.stream_answer(case.ask(question, max_tokens), stats):
                    yield history + [{"role": "assistant", "content": answer}], "", case
        except (RequestError, ServiceUnavailable) as exc:
            raise user_error(exc) from exc
        except Exception as exc:
            raise internal_error(exc) from exc
        updated = case.answered(question, answer, answer_details_markdown(stats))
        yield updated.chat_messages(), "", updated

    def report(case: Case, exports):
        """Stream the model's report text, then show it parsed into the schema with confidence, and offer both
        exports. Yields (report box, JSON download, Markdown download, export state)."""
        if not active(case):
            raise refused("Upload a chest X-ray first, then ask for a report.")
        remove_report_files(exports)
        hidden = gr.update(value=None, visible=False)
        text, stats = "", GenerationStats()
        try:
            with answering.hold(case.conversation_id):
                for text in service.stream_answer(report_request(case.model_image, max_tokens), stats):
                    yield text, hidden, hidden, None
        except (RequestError, ServiceUnavailable) as exc:
            raise user_error(exc) from exc
        except Exception as exc:
            raise internal_error(exc) from exc
        parsed = parse_report(text, stats)
        report_id = uuid.uuid4().hex[:4]
        info = service.info()
        metadata = {
            "report_id": report_id,
            "film": case.film_label,
            "model": info.model_id if info else None,
            "executor": info.executor if info else None,
            "source": case.film.source if case.film is not None else "",  # (active(case) above: it has one)
            **answer_metadata(stats),
        }
        stem = export_stem(report_id, case.film_label)
        files = write_report_files(parsed, base_dir=uploads.folder, metadata=metadata, stem=stem)
        yield (
            report_markdown(parsed, metadata),
            gr.update(value=str(files.json_path), visible=True),
            gr.update(value=str(files.markdown_path), visible=True),
            files,
        )

    def new_case(case: Case, exports):
        preview, notes, chat, report_text, cleared, json_button, markdown_button, files = clear_case(case, exports)
        return None, preview, notes, chat, "", report_text, cleared, json_button, markdown_button, files

    def new_conversation(case: Case):
        """The chat's clear (trash) icon: the same film, a fresh conversation; the old one's KV is freed."""
        if not isinstance(case, Case):
            return Case()
        service.forget_conversation(case.conversation_id)
        return case.new_conversation()

    def session_ended(case: Case) -> None:
        if isinstance(case, Case):
            service.forget_conversation(case.conversation_id)

    max_age = settings.cache_max_age_s  # previews and never-read uploads: deleted within 1.5x this
    with gr.Blocks(
        title="MedGemma X-Ray assistant", delete_cache=(max(1, max_age // 2), max_age), analytics_enabled=False
    ) as demo:
        case_state = gr.State(Case(), delete_callback=session_ended)
        exports_state = gr.State(None, delete_callback=remove_report_files)  # the last report's export files
        gr.HTML(f"<style>{PAGE_CSS}</style>", padding=False, container=False)
        gr.Markdown("# MedGemma X-Ray assistant\n" + DISCLAIMER)
        badge = gr.Markdown(badge_markdown(service), elem_id="model-badge")
        with gr.Row():
            # --- the film: upload, what the model sees, its notes ---
            with gr.Column(scale=2):
                upload = gr.File(label="Chest X-ray (PA): DICOM, PNG or JPEG", type="filepath", elem_id="film-upload")
                preview = gr.Image(
                    label="What the model sees (padded to square, 896 px)",
                    interactive=False,
                    type="pil",
                    format="png",
                    height=360,
                    alt_text=PREVIEW_ALT,
                    buttons=["fullscreen"],  # no "share" (Spaces only) and no download of a deleted upload
                    elem_id="film-preview",
                )
                film_notes = gr.Markdown(elem_id="film-notes")
            # --- the case: conversation and report, side by side in tabs ---
            with gr.Column(scale=3):
                with gr.Tabs(elem_id="case-tabs") as case_tabs:
                    with gr.Tab("Conversation", id="conversation"):
                        chatbot = gr.Chatbot(
                            label="Conversation", height=420, buttons=["copy", "copy_all"], elem_id="chat"
                        )
                    with gr.Tab("Report", id="report-tab"):
                        report_box = gr.Markdown(elem_id="report-box")
                        with gr.Row():
                            report_json = gr.DownloadButton(
                                "Download report (JSON)", visible=False, elem_id="report-json"
                            )
                            report_md = gr.DownloadButton(
                                "Download report (Markdown)", visible=False, elem_id="report-md"
                            )
                question = gr.Textbox(label="Question", placeholder="Ask about the film...", elem_id="question")
                with gr.Row():
                    ask_button = gr.Button("Ask", variant="primary", elem_id="ask")
                    report_button = gr.Button("Structured report", elem_id="report")
                    new_case_button = gr.Button("New case", elem_id="new-case")
                gr.Examples(
                    examples=[[q] for q in EXAMPLE_QUESTIONS], inputs=[question], label="Teaching-round questions"
                )

        # --- events ---
        cleared_outputs = [preview, film_notes, chatbot, report_box, case_state, report_json, report_md, exports_state]
        # The screen and the model's state are cleared first, so a failed upload leaves no film active.
        upload.upload(clear_case, [case_state, exports_state], cleared_outputs, api_name=False, queue=False).then(
            load_film,
            [upload, case_state],
            [preview, film_notes, chatbot, report_box, case_state],
            api_name="upload_film",
        )
        upload.clear(clear_case, [case_state, exports_state], cleared_outputs, api_name="clear_film")
        chatbot.clear(new_conversation, [case_state], [case_state], api_name="clear_chat")
        generation = dict(concurrency_limit=service.settings.generation_concurrency, concurrency_id="generation")
        ask_event = dict(fn=ask, inputs=[question, case_state], outputs=[chatbot, question, case_state])
        show_chat = dict(fn=lambda: gr.Tabs(selected="conversation"), inputs=None, outputs=case_tabs, queue=False)
        for trigger, name in ((ask_button.click, "ask"), (question.submit, False)):
            trigger(**show_chat, api_name=False).then(**ask_event, api_name=name, **generation).then(
                None, js=SHOW_LAST_ANSWER_JS, api_name=False
            )
        report_button.click(
            lambda: gr.Tabs(selected="report-tab"), None, case_tabs, queue=False, api_name=False, js=SHOW_REPORT_JS
        ).then(
            report,
            [case_state, exports_state],
            [report_box, report_json, report_md, exports_state],
            api_name="report",
            **generation,
        )
        new_case_button.click(
            new_case,
            [case_state, exports_state],
            [upload, *cleared_outputs[:3], question, *cleared_outputs[3:]],
            api_name="new_case",
        )
        demo.load(lambda: badge_markdown(service), None, badge, api_name="model_badge")
        gr.Timer(5.0).tick(lambda: badge_markdown(service), None, badge, api_name=False)
    return demo
