"""MedGemma X-Ray assistant: the Gradio UI and the HTTP server around it.

Layout and thin handlers only; the model lives in serving.service, image input in xray_io.
Run: python app.py [--model_path DIR] [--mode pytorch|trt] [--engine_path DIR] [--port 7860]
Exit status (serving/exit_codes.py): 0 stopped cleanly, 1 start-up failed, 2 bad configuration, 98 port in use.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import sys
import threading
import uuid
from pathlib import Path

from assistant.case import EXAMPLE_QUESTIONS, Case, stream_structured_report
from serving.settings import Settings, SettingsError
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
        text += (
            "\n\n⚠️ **Demo model with random weights: its answers mean nothing.** Set MODEL_PATH to a local MedGemma."
        )
    return text


def build_ui(service):
    import gradio as gr

    from inference_api.errors import RequestError
    from inference_api.types import GenerationStats
    from serving.service import ServiceUnavailable

    max_tokens = service.settings.max_new_tokens

    def user_error(exc: Exception) -> gr.Error:
        return gr.Error(str(exc), duration=None)

    def internal_error(exc: Exception) -> gr.Error:
        incident = uuid.uuid4().hex[:8]
        logger.exception("internal error %s", incident)
        return gr.Error(f"Internal error (incident {incident}); the server is still running. See logs/gradio_app.log.")

    def load_film(file_path: str | None, case: Case):
        if isinstance(case, Case):
            service.forget_conversation(case.conversation_id)  # a new film starts a new conversation
        if not file_path:
            raise gr.Error("No file received. Drop a chest X-ray (DICOM, PNG or JPEG) onto the upload box.")
        try:
            from xray_io.preprocess import model_input_image

            film = load_radiograph(file_path, filename=Path(file_path).name)
            image = model_input_image(film)
        except ImageInputError as exc:
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
            raise gr.Error("Upload a chest X-ray first, then ask about it.")
        if not question:
            raise gr.Error("Type a question (or pick an example) before asking.")
        history = case.chat_messages() + [{"role": "user", "content": question}]
        answer, stats = "", GenerationStats()
        try:
            for answer in service.stream_answer(case.ask(question, max_tokens), stats):
                yield history + [{"role": "assistant", "content": answer}], "", case
        except (RequestError, ServiceUnavailable) as exc:
            raise user_error(exc) from exc
        except Exception as exc:
            raise internal_error(exc) from exc
        updated = case.answered(question, answer)
        yield updated.chat_messages(), "", updated

    def report(case: Case):
        if not case.has_film:
            raise gr.Error("Upload a chest X-ray first, then ask for a report.")
        try:
            yield from stream_structured_report(case, service.stream_answer, max_tokens)
        except (RequestError, ServiceUnavailable) as exc:
            raise user_error(exc) from exc
        except Exception as exc:
            raise internal_error(exc) from exc

    def new_case(case: Case):
        service.forget_conversation(case.conversation_id)
        return None, None, "", [], "", "", Case()

    def session_ended(case: Case) -> None:
        if isinstance(case, Case):
            service.forget_conversation(case.conversation_id)

    with gr.Blocks(title="MedGemma X-Ray assistant", delete_cache=(3600, 3600)) as demo:
        case_state = gr.State(Case(), delete_callback=session_ended)
        gr.Markdown("# MedGemma X-Ray assistant\n" + DISCLAIMER)
        badge = gr.Markdown(badge_markdown(service), elem_id="model-badge")
        with gr.Row():
            with gr.Column(scale=2):
                upload = gr.File(label="Chest X-ray (PA): DICOM, PNG or JPEG", type="filepath", elem_id="film-upload")
                preview = gr.Image(label="What the model sees (padded to square, 896 px)", interactive=False,
                                   type="pil", format="png", height=360, elem_id="film-preview")  # fmt: skip
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

        upload.upload(
            load_film, [upload, case_state], [preview, film_notes, chatbot, report_box, case_state],
            api_name="upload_film",
        )  # fmt: skip
        generation = dict(concurrency_limit=service.settings.generation_concurrency, concurrency_id="generation")
        ask_event = dict(fn=ask, inputs=[question, case_state], outputs=[chatbot, question, case_state])
        ask_button.click(**ask_event, api_name="ask", **generation)
        question.submit(**ask_event, api_name=False, **generation)
        report_button.click(report, [case_state], [report_box], api_name="report", **generation)
        new_case_button.click(
            new_case,
            [case_state],
            [upload, preview, film_notes, chatbot, question, report_box, case_state],
            api_name="new_case",
        )
        demo.load(lambda: badge_markdown(service), None, badge, api_name="model_badge")
        gr.Timer(5.0).tick(lambda: badge_markdown(service), None, badge, api_name=False)
    demo.queue(max_size=service.settings.queue_size, default_concurrency_limit=4)
    return demo


def build_http_app(service, demo):
    """FastAPI app: the UI at /, plus probes and Prometheus metrics. No route here can change the mode."""
    import gradio as gr
    from fastapi import FastAPI, Response
    from fastapi.responses import JSONResponse

    api = FastAPI(title="MedGemma X-Ray assistant")

    @api.get("/healthz")
    def liveness():
        return {"status": "alive"}

    @api.get("/readyz")
    def readiness():
        ready = service.ready.is_set()
        # "instance": this start's id, so start_gradio.sh never takes another server's answer for its own.
        body = {"ready": ready, "mode": service.mode, "instance": service.settings.instance_id}
        return JSONResponse(body, status_code=200 if ready else 503)

    @api.get("/metrics")
    def metrics():
        body, content_type = service.metrics.exposition()
        return Response(content=body, media_type=content_type)

    return gr.mount_gradio_app(
        api, demo, path="/", server_name=service.settings.host, server_port=service.settings.port
    )


class DrainingServer:
    """uvicorn's server, but SIGTERM first lets running answers finish (the UI's event streams stay open forever,
    so waiting on connections would always hit the timeout). A second signal stops at once."""

    def __new__(cls, config, service, drain_timeout_s: float):
        import uvicorn

        from serving.systemd_notify import notify

        class _Server(uvicorn.Server):
            _draining = False

            async def startup(self, sockets=None) -> None:
                await super().startup(sockets=sockets)
                if self.started:  # listening now: only here is "ready" true for systemd's Type=notify
                    notify("READY=1", f"STATUS=serving on port {config.port} (mode {service.mode})")

            def handle_exit(self, sig, frame) -> None:
                if self._draining:
                    return super().handle_exit(sig, frame)
                self._draining = True
                notify("STOPPING=1", f"STATUS=draining: running answers get up to {drain_timeout_s:g} s")
                logger.info("signal %d: refusing new work, letting running answers finish", sig)
                threading.Thread(target=self._drain_then_exit, name="drain", daemon=True).start()

            def _drain_then_exit(self) -> None:
                if not service.drain(drain_timeout_s):
                    logger.warning("answers still running after %.0f s; stopping anyway", drain_timeout_s)
                self.should_exit = True

        return _Server(config)


def configure_logging(log_file: Path | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers = [logging.handlers.RotatingFileHandler(log_file, maxBytes=10 << 20, backupCount=5)]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="MedGemma X-Ray assistant server")
    parser.add_argument("--model_path", type=Path, help="local google/medgemma-4b-it directory (default: demo model)")
    parser.add_argument(
        "--mode", choices=["pytorch", "trt"], help="backend at start (default: INFERENCE_MODE or pytorch)"
    )
    parser.add_argument("--engine_path", type=Path, help="engine bundle from optimize_trt_engine.py")
    parser.add_argument("--host", help="interface for the UI (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="UI port (default 7860)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--log_file", type=Path, help="rotating log file (default: stderr)")
    parser.add_argument("--instance_id", help="this start's id, returned by /readyz (start_gradio.sh sets it)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, backend_factory=None) -> int:
    """Run the server. backend_factory: the service's seam for tests (default: serving.factory.create_backend)."""
    from serving import exit_codes
    from serving.listener import PortInUseError, reserve_port

    args = parse_args(argv)
    configure_logging(args.log_file)
    try:
        settings = Settings.from_env(
            model_path=args.model_path, inference_mode=args.mode, engine_path=args.engine_path,
            host=args.host, port=args.port, device=args.device, instance_id=args.instance_id,
        )  # fmt: skip
        if not settings.instance_id:
            settings = settings.with_overrides(instance_id=uuid.uuid4().hex)
    except SettingsError as exc:
        logger.error("bad configuration: %s", exc)
        return exit_codes.BAD_CONFIGURATION
    try:  # before the model loads: a taken port fails in milliseconds, and nobody can take it meanwhile
        listener = reserve_port(settings.host, settings.port)
    except (PortInUseError, OSError) as exc:
        logger.error("cannot listen: %s", exc)
        print(f"error: cannot listen: {exc}", file=sys.stderr)
        return exit_codes.PORT_IN_USE if isinstance(exc, PortInUseError) else exit_codes.BAD_CONFIGURATION
    logger.info("starting (PID %d, instance %s)", os.getpid(), settings.instance_id)

    import uvicorn

    from serving.service import InferenceService

    service = InferenceService(settings) if backend_factory is None else InferenceService(settings, backend_factory)
    control = None
    try:
        service.start()
        from serving.control import ControlServer

        control = ControlServer(service, settings.control_socket_path)
        control.start()
    except Exception as exc:
        logger.error("startup failed: %s", exc)
        service.close()
        listener.close()
        return exit_codes.STARTUP_FAILED
    app = build_http_app(service, build_ui(service))
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=3
    )
    server = DrainingServer(config, service, settings.drain_timeout_s)
    logger.info("serving on http://%s:%d (mode %s)", settings.host, settings.port, service.mode)
    try:  # uvicorn turns SIGTERM/SIGINT into a graceful shutdown: running requests finish first
        server.run(sockets=[listener])
    finally:
        if control is not None:
            control.close()
        service.close()
        logger.info("stopped")
    return exit_codes.OK


if __name__ == "__main__":
    threading.current_thread().name = "main"
    raise SystemExit(main())
