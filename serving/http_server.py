"""The HTTP server around the UI: FastAPI with probes and metrics, Gradio mounted at /, uvicorn with draining.

Run through app.py (python app.py [--model_path DIR] [--mode pytorch|trt] [--port 7860] ...), which hands main()
the UI builder; this module never imports the UI.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from serving.settings import Settings, SettingsError

logger = logging.getLogger("app")

NO_API_DOCS = {"docs_url": None, "redoc_url": None, "openapi_url": None}


def build_http_app(service, demo, upload_folder: Path, auth: Callable[[str, str], bool] | None = None):
    """FastAPI app: the UI at /, plus probes and Prometheus metrics. No route here can change the mode."""
    import gradio as gr
    from fastapi import FastAPI, Response
    from fastapi.responses import JSONResponse

    from serving.http_guards import FileReferenceGuard, PoliteBusyQueue

    api = FastAPI(title="MedGemma X-Ray assistant", **NO_API_DOCS)

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

    settings = service.settings
    app = gr.mount_gradio_app(
        api,
        demo,
        path="/",
        server_name=settings.host,
        server_port=settings.port,
        app_kwargs=dict(NO_API_DOCS),
        show_error=False,  # errors reach the user only as the handlers' own gr.Error messages: no server paths
        max_file_size=settings.max_file_size_bytes,
        auth=auth,
        run_history=False,  # else the browser keeps every film and question for the next user of a shared PC
        auth_message="Log in with the name and password the operator gave you." if auth else None,
    )
    # Gradio checks that a file input really came through its upload route (and refuses any other path) only
    # once the Blocks count as launched; demo.launch() sets that, gr.mount_gradio_app() does not. Without it, a
    # client can name any server file (/etc/shadow, the control token) and get it back as a "preview".
    demo.has_launched = True
    app.add_middleware(FileReferenceGuard, upload_folder=upload_folder)
    app.add_middleware(PoliteBusyQueue)
    return app


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


def main(argv: list[str] | None = None, *, build_ui, backend_factory=None) -> int:
    """Start the server; build_ui(service, uploads) returns the Gradio Blocks. backend_factory: the service's seam
    for tests (default: serving.factory.create_backend). Exit status (serving/exit_codes.py): 0 stopped cleanly,
    1 start-up failed, 2 bad configuration, 98 port in use."""
    from serving import exit_codes
    from serving.listener import PortInUseError, reserve_port

    args = parse_args(argv)
    os.umask(0o077)  # everything the server writes (logs, cached previews, uploads, socket) is private to its user
    configure_logging(args.log_file)
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # read by gradio at import: no telemetry calls out
    try:
        settings = Settings.from_env(
            model_path=args.model_path,
            inference_mode=args.mode,
            engine_path=args.engine_path,
            host=args.host,
            port=args.port,
            device=args.device,
            instance_id=args.instance_id,
        )
        if not settings.instance_id:
            settings = settings.with_overrides(instance_id=uuid.uuid4().hex)
        from serving.http_auth import authenticator
        from serving.upload_cache import PrivateCache, UploadInbox

        auth = authenticator(settings.auth_file) if settings.auth_file else None
        cache = PrivateCache.open(settings.upload_cache_path)  # before gradio is imported: sets GRADIO_TEMP_DIR
    except (SettingsError, ValueError) as exc:  # ValueError: the upload cache or the login file
        logger.error("bad configuration: %s", exc)
        return exit_codes.BAD_CONFIGURATION
    try:  # before the model loads: a taken port fails in milliseconds, and nobody can take it meanwhile
        listener = reserve_port(settings.host, settings.port)
    except (PortInUseError, OSError) as exc:
        logger.error("cannot listen: %s", exc)
        print(f"error: cannot listen: {exc}", file=sys.stderr)
        cache.close()
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
        cache.close()
        listener.close()
        return exit_codes.startup_exit_code(exc)  # 2 for what a restart cannot fix (issue 17)
    app = build_http_app(service, build_ui(service, UploadInbox(cache.path)), cache.path, auth=auth)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,  # URLs name files
        timeout_graceful_shutdown=3,
    )
    server = DrainingServer(config, service, settings.drain_timeout_s)
    logger.info(
        "serving on http://%s:%d (mode %s, login %s)",
        settings.host,
        settings.port,
        service.mode,
        "required" if auth else "off",
    )
    try:  # uvicorn turns SIGTERM/SIGINT into a graceful shutdown: running requests finish first
        server.run(sockets=[listener])
    finally:
        if control is not None:
            control.close()
        service.close()
        cache.close()
        logger.info("stopped")
    return exit_codes.OK
