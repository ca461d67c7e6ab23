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
from typing import TYPE_CHECKING, Any

from medgemma_xray.serving.settings import Settings, SettingsError

if TYPE_CHECKING:
    from medgemma_xray.serving.surface import ServingProcess

logger = logging.getLogger("app")

NO_API_DOCS: dict[str, Any] = {"docs_url": None, "redoc_url": None, "openapi_url": None}
MAX_REQUEST_HEAD_BYTES = 16 << 10  # request line plus headers (h11's default, said on purpose)


def build_http_app(
    service: ServingProcess,
    demo,
    upload_folder: Path,
    auth: Callable[[str, str], bool] | None = None,
    extend: Callable | None = None,
):
    """FastAPI app: the UI at /, plus probes and Prometheus metrics. No route here can change the mode.

    extend(api, service): adds routes (an API beside the UI) to the FastAPI app before Gradio mounts at /.
    Built in four steps: the FastAPI app and its own routes, the extension, Gradio mounted at /, then the guards
    (middleware wraps everything mounted, so they see every route)."""
    import gradio as gr
    from fastapi import FastAPI, Response
    from fastapi.responses import JSONResponse

    from medgemma_xray.web.body_deadline import BodyDeadline
    from medgemma_xray.web.file_owners import FileOwnerGuard, FileOwners
    from medgemma_xray.web.gradio_queue import tune_queue
    from medgemma_xray.web.http_guards import CallShapes, FileReferenceGuard, PoliteBusyQueue, RouteGuard
    from medgemma_xray.web.upload_cache import UploadLedger
    from medgemma_xray.web.upload_route import UploadRoute

    api = FastAPI(title="MedGemma X-Ray assistant", **NO_API_DOCS)

    # The probes are coroutines: they never wait for a worker thread, whatever holds the pool.
    @api.get("/healthz")
    async def liveness():
        return {"status": "alive"}

    @api.get("/readyz")
    async def readiness():
        ready = service.ready.is_set()
        # "instance": this start's id, so start_gradio.sh never takes another server's answer for its own.
        body = {"ready": ready, "mode": service.mode, "instance": service.settings.instance_id}
        return JSONResponse(body, status_code=200 if ready else 503)

    @api.get("/metrics")
    def metrics():
        body, content_type = service.metrics.exposition()
        return Response(content=body, media_type=content_type)

    from medgemma_xray.web.login_guard import LoginBudget, LoginGuard, LoginThrottle
    from medgemma_xray.web.openai import add_openai_routes  # the OpenAI-compatible API, before Gradio's "/"

    guard = LoginGuard(auth) if auth is not None else None  # one scrypt pool and one failure book for both doors
    add_openai_routes(api, service, guard)
    settings = service.settings
    if extend is not None:
        extend(api, service)
    limit_session_state(demo, settings)
    from medgemma_xray.web.session_strays import drop_stray_components

    drop_stray_components(demo)  # a component copy per update, per session, for the session's life
    tune_queue(demo)
    app = gr.mount_gradio_app(
        api,
        demo,
        path="/",
        server_name=settings.host,
        server_port=settings.port,
        app_kwargs=dict(NO_API_DOCS),
        show_error=False,  # errors reach the user only as the handlers' own gr.Error messages: no server paths
        max_file_size=settings.max_file_size_bytes,
        auth=guard.gradio_auth if guard is not None else None,  # a coroutine: Gradio awaits it, off its loop
        run_history=False,  # else the browser keeps every film and question for the next user of a shared PC
        auth_message="Log in with the name and password the operator gave you." if auth else None,
    )
    # Gradio checks that a file input really came through its upload route (and refuses any other path) only
    # once the Blocks count as launched; demo.launch() sets that, gr.mount_gradio_app() does not. Without it, a
    # client can name any server file (/etc/shadow, the control token) and get it back as a "preview".
    demo.has_launched = True
    ledger = UploadLedger(settings.upload_cache_max_mb << 20, settings.upload_max_age_s)
    app.add_middleware(FileReferenceGuard, upload_folder=upload_folder, calls=CallShapes(demo))
    app.add_middleware(PoliteBusyQueue)
    upload = UploadRoute(
        upload_folder,
        ledger,
        max_files=settings.max_files_per_request,
        max_file_bytes=settings.max_file_size_bytes,
        uploaded=demo.upload_file_set,
    )
    app.add_middleware(FileOwnerGuard, owners=FileOwners(upload_folder, settings.cache_max_age_s))
    app.add_middleware(RouteGuard, ledger=ledger, upload=upload)
    if guard is not None:
        app.add_middleware(LoginBudget, guard=guard, per_login=settings.per_client_connections)
        app.add_middleware(LoginThrottle, guard=guard)
    app.add_middleware(BodyDeadline, timeout_s=settings.body_timeout_s)  # outermost: every body reader is bounded
    return app


def guarded_uvicorn_config(app, settings: Settings):
    """uvicorn's configuration for every listener of this project (the single server and the Ray Serve ingress):
    the head timeout and the connection budget in the protocol, a bounded head, no access log."""
    import uvicorn

    from medgemma_xray.web.connection_budget import PROBE_RESERVE, ConnectionBook
    from medgemma_xray.web.listener import guarded_protocol

    book = ConnectionBook(per_client=settings.per_client_connections, max_connections=settings.max_connections)
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        log_config=None,  # uvicorn's records go through our handler and its repeat limiter, not to the console
        access_log=False,  # URLs name files
        timeout_graceful_shutdown=3,
        # h11 with the head timeout and the budget
        http=guarded_protocol(settings.header_timeout_s, book, keep_alive_s=settings.keep_alive_timeout_s),
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        # the hard ceiling: past MAX_CONNECTIONS only the probes are served, in PROBE_RESERVE more connections;
        # beyond that uvicorn answers 503 at once, never a stalled accept()
        limit_concurrency=settings.max_connections + PROBE_RESERVE,
    )


def limit_session_state(demo, settings: Settings) -> None:
    """Every session's state expires SESSION_TTL_S after its last change, and at most SESSION_CAPACITY sessions
    are held (Gradio's own knobs: State.time_to_live, Blocks.state_session_capacity, default infinite and 10,000).
    API clients send no heartbeat, so without a time-to-live an idle session's case is kept until 10,000 others
    push it out. A State the UI gave its own time-to-live keeps it."""
    import math

    import gradio as gr

    from medgemma_xray.serving.memory import TrimSoon

    demo.state_session_capacity = settings.session_capacity
    trim = TrimSoon()
    for block in demo.blocks.values():
        if not isinstance(block, gr.State):
            continue
        if block.time_to_live == math.inf:
            block.time_to_live = settings.session_ttl_s
        block.delete_callback = _then(block.delete_callback, trim)


def _then(callback, after):
    def both(value) -> None:
        try:
            callback(value)
        finally:
            after()

    return both


def draining_server(config, service, drain_timeout_s: float):
    """uvicorn's server, but SIGTERM first lets running answers finish (the UI's event streams stay open forever,
    so waiting on connections would always hit the timeout). A second signal stops at once. uvicorn is imported
    here, not at module import."""
    import uvicorn

    from medgemma_xray.serving.systemd_notify import notify

    class DrainingServer(uvicorn.Server):
        _draining = False
        drain_thread: threading.Thread | None = None  # owned here; it ends by setting should_exit

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
            self.drain_thread = threading.Thread(target=self._drain_then_exit, name="drain", daemon=True)
            self.drain_thread.start()

        def _drain_then_exit(self) -> None:
            if not service.drain(drain_timeout_s):
                logger.warning("answers still running after %.0f s; stopping anyway", drain_timeout_s)
            self.should_exit = True

    return DrainingServer(config)


def configure_logging(log_file: Path | None, repeats_per_minute: int | None = None):
    """Log to the rotating file (or stderr), every record through one RepeatLimiter (medgemma_xray.serving.log_limits), so a
    flood of one record cannot rotate the earlier lines away. The file's handler (serving/log_disk.py) outlives a
    full log disk: it drops and counts records meanwhile, and logs the count once it can write again. Returns the
    limiter (its rate is a setting, read after logging starts)."""
    from medgemma_xray.serving.log_disk import LogDiskHandler
    from medgemma_xray.serving.log_limits import RepeatLimiter

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handlers = [LogDiskHandler(log_file, maxBytes=10 << 20, backupCount=5)]
    limiter = RepeatLimiter(repeats_per_minute or Settings.log_repeats_per_minute)
    for handler in handlers:
        handler.addFilter(limiter)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True
    )
    return limiter


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


def main(argv: list[str] | None = None, *, build_ui, backend_factory=None, extend=None) -> int:
    """Start the server; build_ui(service, uploads) returns the Gradio Blocks. backend_factory: the service's seam
    for tests (default: medgemma_xray.serving.factory.create_backend). Exit status (serving/exit_codes.py): 0 stopped cleanly,
    1 start-up failed, 2 bad configuration, 98 port in use."""
    from medgemma_xray.serving import exit_codes
    from medgemma_xray.web.listener import PortInUseError, raise_open_file_limit, reserve_port

    args = parse_args(argv)
    os.umask(0o077)  # everything the server writes (logs, cached previews, uploads, socket) is private to its user
    log_limiter = configure_logging(args.log_file)
    if args.log_file is not None:  # under start_gradio.sh and systemd: what libraries print goes to the log too
        from medgemma_xray.serving.console_log import capture_console

        capture_console()
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
        log_limiter.rate_per_s = settings.log_repeats_per_minute / 60.0
        from medgemma_xray.serving.log_dir import check_log_dir_path
        from medgemma_xray.web.http_auth import authenticator
        from medgemma_xray.web.upload_cache import PrivateCache, UploadInbox

        check_log_dir_path(settings.log_dir)  # before anything is written under it
        auth = authenticator(settings.auth_file) if settings.auth_file else None
        cache = PrivateCache.open(settings.upload_cache_path)  # before gradio is imported: sets GRADIO_TEMP_DIR
    except (SettingsError, ValueError) as exc:  # ValueError: the upload cache or the login file
        logger.error("bad configuration: %s", exc)
        return exit_codes.BAD_CONFIGURATION
    try:  # before the model loads: a taken port fails in milliseconds, and nobody can take it meanwhile
        listener = reserve_port(settings.host, settings.port)
    except (PortInUseError, OSError) as exc:
        logger.error("cannot listen: %s", exc)
        from medgemma_xray.serving.console_log import operator_stderr

        print(f"error: cannot listen: {exc}", file=operator_stderr())
        cache.close()
        return exit_codes.PORT_IN_USE if isinstance(exc, PortInUseError) else exit_codes.BAD_CONFIGURATION
    logger.info("starting (PID %d, instance %s)", os.getpid(), settings.instance_id)
    from medgemma_xray.serving.memory import keep_heap_small

    # Before any model allocates and before the workers start: freed memory leaves RSS (serving/memory.py).
    trimmer = keep_heap_small(logger)
    old_files, open_files = raise_open_file_limit()
    if open_files < settings.max_connections + 256:
        logger.warning(
            "the open-file limit is %d (raised from %d), below MAX_CONNECTIONS %d plus the server's own files: "
            "raise LimitNOFILE (systemd) or ulimit -Hn",
            open_files,
            old_files,
            settings.max_connections,
        )

    from medgemma_xray.serving.service import InferenceService

    service: ServingProcess = (
        InferenceService(settings) if backend_factory is None else InferenceService(settings, backend_factory)
    )
    control = None
    try:
        service.start()
        from medgemma_xray.serving.control import ControlServer

        control = ControlServer(service, settings.control_socket_path)
        control.start()
    except Exception as exc:
        logger.error("startup failed: %s", exc)
        service.close()
        trimmer.close()
        cache.close()
        listener.close()
        return exit_codes.startup_exit_code(exc)  # 2 for what a restart cannot fix
    app = build_http_app(service, build_ui(service, UploadInbox(cache.path)), cache.path, auth=auth, extend=extend)
    config = guarded_uvicorn_config(app, settings)
    server = draining_server(config, service, settings.drain_timeout_s)
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
        if server.drain_thread is not None:  # finished when should_exit was set; joined as its owner
            server.drain_thread.join(timeout=settings.drain_timeout_s)
        if control is not None:
            control.close()
        service.close()
        trimmer.close()
        cache.close()
        logger.info("stopped")
    return exit_codes.OK
