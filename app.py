"""MedGemma X-Ray assistant: the Gradio UI.

Layout and thin handlers only; the model lives in serving.service, image input in xray_io, the HTTP server in
serving.http_server.
Run: python app.py [--model_path DIR] [--mode pytorch|trt] [--engine_path DIR] [--port 7860]
"""

from __future__ import annotations

import logging
import traceback
import uuid

from assistant.case import EXAMPLE_QUESTIONS, Case
from engine_bundle.defaults import DEMO_NOTICE
from serving.limits import RequestLimits
from xray_io import ImageInputError, load_radiograph

logger = logging.getLogger("app")

DISCLAIMER = (
    "**For education and research only. Not a medical device and not for diagnosis.** "
    "Answers can be wrong; a qualified radiologist must read every film."
)
PREVIEW_SIZE = 896  # the processor's input size: the preview is exactly what the model sees


def badge_markdown(service) -> str:
    info = service.info()
    if info is None:
        return "Model: loading..."
    text = (
        f"**Mode:** {info.mode_label} &nbsp; **Precision:** {info.precision.upper()} &nbsp; "
        f"**Executor:** {info.executor} &nbsp; **Device:** {info.device} &nbsp; **Model:** {info.model_id}"
    )
    breaker = service.breaker.snapshot()
    if breaker.state == "open":
        text += f"\n\n⚠️ **TensorRT disabled by the circuit breaker** ({breaker.last_failure}); serving on PyTorch."
    if info.is_demo:
        notice = info.demo_notice or DEMO_NOTICE
        text += f"\n\n⚠️ **{notice}** Set MODEL_PATH to a local MedGemma for real films."
    return text


def build_ui(service, uploads=None):
    """uploads: the serving.upload_cache.UploadInbox that reads (and deletes) each upload once."""
    import gradio as gr

    from assistant.answer_details import answer_details_markdown
    from assistant.report import parse_report, report_request
    from assistant.report_export import remove_report_files, report_markdown, write_report_files
    from inference_api.errors import RequestError
    from inference_api.types import GenerationStats
    from serving.service import ServiceUnavailable
    from serving.upload_cache import NotAnUploadError, UploadGoneError, UploadInbox

    settings = service.settings
    max_tokens = settings.max_new_tokens
    limits = RequestLimits.from_settings(settings)
    if uploads is None:
        from gradio.utils import get_upload_folder

        uploads = UploadInbox(get_upload_folder())

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

    def load_film(file_path: str | None, case: Case):
        if isinstance(case, Case):
            service.forget_conversation(case.conversation_id)  # a new film starts a new conversation
        if not file_path:
            raise refused("No file received. Drop a chest X-ray (DICOM, PNG or JPEG) onto the upload box.")
        try:
            from xray_io.preprocess import model_input_image

            data = uploads.take(file_path)  # the upload is deleted from disk here, before decoding
            film = load_radiograph(data, max_pixels=settings.max_pixels, max_bytes=settings.max_file_size_bytes)
            image = model_input_image(film)
        except (ImageInputError, NotAnUploadError, UploadGoneError) as exc:
            raise user_error(exc) from exc
        except Exception as exc:
            raise internal_error(exc) from exc
        for warning in film.warnings:
            gr.Warning(warning)
        preview = image.resize((PREVIEW_SIZE, PREVIEW_SIZE))
        # Gradio caches images under a hash of their bytes and rewrites that file on every save, so two users
        # uploading the same film (common on teaching rounds) could be served a half-written preview. A unique
        # PNG text chunk gives each upload its own cache file.
        preview.info["upload"] = uuid.uuid4().hex
        notes = "\n".join(f"- ⚠️ {warning}" for warning in film.warnings)
        summary = f"**Loaded:** {film.source}, {film.shape[1]}×{film.shape[0]} px\n\n{notes}".strip()
        return preview, summary, [], "", Case(film=film, model_image=image)

    def ask(question: str, case: Case):
        question = (question or "").strip()
        if not case.has_film:
            raise refused("Upload a chest X-ray first, then ask about it.")
        if not question:
            raise refused("Type a question (or pick an example) before asking.")
        history = case.chat_messages() + [{"role": "user", "content": question}]
        answer, stats = "", GenerationStats()
        try:
            limits.check_question(len(case.turns) // 2, question)
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
        if not case.has_film:
            raise refused("Upload a chest X-ray first, then ask for a report.")
        remove_report_files(exports)
        hidden = gr.update(value=None, visible=False)
        text, stats = "", GenerationStats()
        try:
            for text in service.stream_answer(report_request(case.model_image, max_tokens), stats):
                yield text, hidden, hidden, None
        except (RequestError, ServiceUnavailable) as exc:
            raise user_error(exc) from exc
        except Exception as exc:
            raise internal_error(exc) from exc
        parsed = parse_report(text, stats)
        metadata = {
            "model": service.info().model_id if service.info() else None,
            "source": case.film.source,
            "answer": answer_details_markdown(stats, explain=False),
        }
        files = write_report_files(parsed, base_dir=uploads.folder, metadata=metadata)
        yield (
            report_markdown(parsed, metadata),
            gr.update(value=str(files.json_path), visible=True),
            gr.update(value=str(files.markdown_path), visible=True),
            files,
        )

    def new_case(case: Case, exports):
        service.forget_conversation(case.conversation_id)
        remove_report_files(exports)
        hidden = gr.update(value=None, visible=False)
        return None, None, "", [], "", "", Case(), hidden, hidden, None

    def session_ended(case: Case) -> None:
        if isinstance(case, Case):
            service.forget_conversation(case.conversation_id)

    max_age = settings.cache_max_age_s  # previews and never-read uploads: deleted within 1.5x this
    with gr.Blocks(
        title="MedGemma X-Ray assistant", delete_cache=(max(1, max_age // 2), max_age), analytics_enabled=False
    ) as demo:
        case_state = gr.State(Case(), delete_callback=session_ended)
        exports_state = gr.State(None, delete_callback=remove_report_files)  # the last report's export files
        gr.Markdown("# MedGemma X-Ray assistant\n" + DISCLAIMER)
        badge = gr.Markdown(badge_markdown(service), elem_id="model-badge")
        with gr.Row():
            with gr.Column(scale=2):
                upload = gr.File(label="Chest X-ray (PA): DICOM, PNG or JPEG", type="filepath", elem_id="film-upload")
                preview = gr.Image(
                    label="What the model sees (padded to square, 896 px)",
                    interactive=False,
                    type="pil",
                    format="png",
                    height=360,
                    elem_id="film-preview",
                )
                film_notes = gr.Markdown(elem_id="film-notes")
            with gr.Column(scale=3):
                chatbot = gr.Chatbot(label="Conversation", height=420, elem_id="chat")
                question = gr.Textbox(label="Question", placeholder="Ask about the film...", elem_id="question")
                with gr.Row():
                    ask_button = gr.Button("Ask", variant="primary", elem_id="ask")
                    report_button = gr.Button("Structured report", elem_id="report")
                    new_case_button = gr.Button("New case", elem_id="new-case")
                gr.Examples(
                    examples=[[q] for q in EXAMPLE_QUESTIONS], inputs=[question], label="Teaching-round questions"
                )
                report_box = gr.Markdown(elem_id="report-box")
                with gr.Row():
                    report_json = gr.DownloadButton("Download report (JSON)", visible=False, elem_id="report-json")
                    report_md = gr.DownloadButton("Download report (Markdown)", visible=False, elem_id="report-md")

        upload.upload(
            load_film,
            [upload, case_state],
            [preview, film_notes, chatbot, report_box, case_state],
            api_name="upload_film",
        )
        generation = dict(concurrency_limit=service.settings.generation_concurrency, concurrency_id="generation")
        ask_event = dict(fn=ask, inputs=[question, case_state], outputs=[chatbot, question, case_state])
        ask_button.click(**ask_event, api_name="ask", **generation)
        question.submit(**ask_event, api_name=False, **generation)
        report_button.click(
            report,
            [case_state, exports_state],
            [report_box, report_json, report_md, exports_state],
            api_name="report",
            **generation,
        )
        new_case_button.click(
            new_case,
            [case_state, exports_state],
            [
                upload,
                preview,
                film_notes,
                chatbot,
                question,
                report_box,
                case_state,
                report_json,
                report_md,
                exports_state,
            ],
            api_name="new_case",
        )
        demo.load(lambda: badge_markdown(service), None, badge, api_name="model_badge")
        gr.Timer(5.0).tick(lambda: badge_markdown(service), None, badge, api_name=False)
    from teaching_ui import add_teaching_page  # issue 23: the teaching-rounds page at /teaching

    add_teaching_page(demo, service, uploads)
    demo.queue(max_size=service.settings.queue_size, default_concurrency_limit=4)
    return demo


def main(argv: list[str] | None = None, backend_factory=None) -> int:
    """Run the server (serving.http_server) with this UI. backend_factory: the service's seam for tests."""
    from serving.http_server import main as serve

    return serve(argv, build_ui=build_ui, backend_factory=backend_factory)


if __name__ == "__main__":
    import threading

    threading.current_thread().name = "main"
    raise SystemExit(main())
