"""The Ray Serve application: N ModelReplica deployments (one GPU each; none for the CPU demo) behind one ingress
that serves the Gradio UI, the OpenAI-compatible API and the probes, with the single server's own code.

    medgemma-xray-ray start deploy/ray/medgemma-gpu.yaml     # Ray on loopback with its token, then serve deploy

build_app's arguments (all optional; the config's `args:`): replicas, gpus_per_replica, cpus_per_replica,
max_ongoing_requests, ingress_resource (a Ray custom resource that pins the ingress to the node that has it), and
any medgemma_xray.serving.settings field in lower case (model_path, inference_mode, engine_path,
generation_concurrency, queue_size, auth_file, host, port, ...). The replicas' settings also come from each node's
environment, as for the systemd service. The ingress listens on HOST:PORT (default 127.0.0.1:7860) with the single
server's guards and login (scaleout/ingress_listener.py); Serve's own proxy serves none of the app.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from medgemma_xray.serving.surface import ServingProcess

logger = logging.getLogger(__name__)

APP_ARGS = (
    "replicas",
    "gpus_per_replica",
    "cpus_per_replica",
    "max_ongoing_requests",
    "health_check_period_s",
    "ingress_resource",
)
MODEL_DEPLOYMENT = "ModelReplica"
ROUTER_CLASS = "medgemma_xray.scaleout.router:ConversationAffinityRouter"


def split_args(args: dict) -> tuple[dict, dict]:
    """(application arguments, settings overrides); an unknown name is refused with the valid ones listed."""
    from medgemma_xray.serving.settings import Settings

    setting_names = {spec.name for spec in fields(Settings)}
    app, settings = {}, {}
    for key, value in (args or {}).items():
        if key in APP_ARGS:
            app[key] = value
        elif key in setting_names:
            settings[key] = str(value)
        else:
            valid = ", ".join(sorted((*APP_ARGS, *setting_names)))
            raise ValueError(f"unknown application argument {key!r}; valid: {valid}")
    return app, settings


def build_ingress_app(handle, settings_overrides: dict) -> tuple[Any, ServingProcess, Any]:
    """FastAPI app of the ingress replica: the single server's build_http_app over a ReplicaSetService."""
    from medgemma_xray.scaleout.remote_service import ReplicaSetService
    from medgemma_xray.serving.log_dir import check_log_dir_path
    from medgemma_xray.serving.settings import Settings
    from medgemma_xray.web.app import build_ui
    from medgemma_xray.web.http_auth import authenticator
    from medgemma_xray.web.http_server import build_http_app
    from medgemma_xray.web.upload_cache import PrivateCache, UploadInbox

    settings = Settings.from_env(**settings_overrides)
    check_log_dir_path(settings.log_dir)  # the ingress writes its upload cache there
    auth = authenticator(settings.auth_file) if settings.auth_file else None
    cache = PrivateCache.open(settings.upload_cache_path)  # before gradio is imported: sets GRADIO_TEMP_DIR
    service: ServingProcess = ReplicaSetService(handle, settings)
    service.start()  # in the background: Serve builds this replica's app on its event loop, which must not block
    app = build_http_app(service, build_ui(service, UploadInbox(cache.path)), cache.path, auth=auth)
    add_replicas_route(app, service)
    return app, service, cache


def add_replicas_route(app, service) -> None:
    """GET /replicas: each model replica's last report (id, readiness, mode, breaker, load), as /readyz is open.
    Placed before Gradio's mount at /, which would otherwise take the path."""

    def replicas() -> dict:
        listed = service.replica_stats()
        return {"ready": sum(bool(r.get("ready")) for r in listed), "replicas": listed}

    app.add_api_route("/replicas", replicas, methods=["GET"])
    app.router.routes.insert(0, app.router.routes.pop())


def build_app(args: dict | None = None):
    """The Serve application (`import_path: medgemma_xray.scaleout.serve_app:build_app`)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from medgemma_xray.scaleout.replica import ModelReplica

    app_args, overrides = split_args(dict(args or {}))
    if "model_path" in overrides:
        overrides["model_path"] = str(Path(overrides["model_path"]).resolve())
    replicas = int(app_args.get("replicas", 1))
    gpus = float(app_args.get("gpus_per_replica", 1))
    options: dict[str, Any] = {"num_gpus": gpus, "num_cpus": float(app_args.get("cpus_per_replica", 1))}
    if gpus == 0:  # CPU demo replicas: one thread each, so N replicas share the cores instead of fighting for them
        options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    ingress_options: dict[str, Any] = {"num_cpus": 0.5}
    if app_args.get("ingress_resource"):  # a custom resource only the node with the public address has
        ingress_options["resources"] = {str(app_args["ingress_resource"]): 0.001}
    model = serve.deployment(
        ModelReplica,
        name=MODEL_DEPLOYMENT,
        num_replicas=replicas,
        ray_actor_options=options,
        max_ongoing_requests=int(app_args.get("max_ongoing_requests", 64)),
        health_check_period_s=float(app_args.get("health_check_period_s", 5)),
        health_check_timeout_s=30,
        graceful_shutdown_timeout_s=float(overrides.get("drain_timeout_s", 120)),
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_routing_stats_period_s=2,
            request_routing_stats_timeout_s=10,
        ),
    )

    @serve.deployment(name="Ingress", num_replicas=1, ray_actor_options=ingress_options, max_ongoing_requests=100)
    class Ingress:
        """The one entry point: UI, OpenAI API, probes and metrics (Gradio's queue needs a single process), served
        on HOST:PORT by the project's guarded listener (scaleout/ingress_listener.py), not by Serve's proxy."""

        def __init__(self, model_handle, settings_overrides: dict) -> None:
            from medgemma_xray.scaleout.ingress_listener import IngressListener
            from medgemma_xray.serving.memory import keep_heap_small

            self._trimmer = keep_heap_small(logger)  # Gradio's sessions live in this process
            self._asgi, self._service, self._cache = build_ingress_app(model_handle, settings_overrides)
            self._listener = IngressListener(self._asgi, self._service.settings)
            self._listener.start()

        async def __call__(self, request):
            """Serve's proxy (127.0.0.1 only) reaches nothing of the app: it says where the app listens."""
            from starlette.responses import PlainTextResponse

            settings = self._service.settings
            return PlainTextResponse(f"The app listens on {settings.host}:{settings.port}.\n", status_code=404)

        def check_health(self) -> None:
            """Serve's liveness check: the listener thread runs. /readyz says 503 until a replica answers (each
            replica's own check is the service's readiness)."""
            if not self._listener.alive:
                raise RuntimeError("the ingress listener stopped")

        def __del__(self) -> None:
            if getattr(self, "_listener", None) is not None:
                self._listener.close()
            if getattr(self, "_service", None) is not None:
                self._service.close()
                self._cache.close()
            if getattr(self, "_trimmer", None) is not None:
                self._trimmer.close()

    # serve.deployment returns a Deployment (which has bind) at run time; its stubs type the decorated class as itself
    return Ingress.bind(model.bind(overrides), overrides)  # type: ignore[attr-defined]
