"""The one surface every door is written against: the main page, /teaching, the OpenAI routes and the Ray ingress.

As vLLM's EngineClient is for its front ends, this Protocol is the whole of what a door may call on the model.
Two classes implement it: serving.service.InferenceService (one process, one backend at a time) and
scaleout.remote_service.ReplicaSetService (answers from Ray Serve replicas). mypy checks each against it where
the server builds its service, so a door that needs something new adds it here, to both, on purpose.

ServingProcess adds what only the process that owns the service calls: start, drain, close and the metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from PIL import Image

    from medgemma_xray.inference_api.types import BackendInfo, GenerationRequest, GenerationStats, Mode
    from medgemma_xray.serving.metrics import ServiceMetrics
    from medgemma_xray.serving.settings import Settings


class InferenceSurface(Protocol):
    """What a door may call. Errors are RequestError (the user's to fix) and ServiceUnavailable (retry later)."""

    settings: Settings
    ready: threading.Event  # set while answers are taken

    @property
    def mode(self) -> Mode | None:
        """The backend serving now (None while none is loaded)."""

    def info(self) -> BackendInfo | None:
        """What serves, for badges and notes: executor, precision, model, demo or not."""

    def stream_answer(
        self, request: GenerationRequest, stats: GenerationStats | None = None
    ) -> Generator[str, None, None]:
        """The answer so far, cumulative, as it streams; `stats` is filled as it goes. Closing the iterator ends the
        answer and frees its decode slot."""

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        """The tokens the serving model's own tokenizer and chat template make of the request's prompt (its image
        tokens included, no cache reuse counted), without running the model: what a door checks against the
        sequence limit before it submits. The request's image is not read."""

    def prepare_film(self, image: Image.Image) -> None:
        """Get a film ready for the vision tower on arrival, before anyone asks (a hint: may do nothing)."""

    def forget_conversation(self, conversation_id: str) -> None:
        """Free a conversation's cached state (new case, closed session). Idempotent."""

    def status(self, brief: bool = False) -> dict[str, Any]:
        """What serves and how it is doing, as JSON-ready values. Always has "ready", "mode", "mode_label" and
        "breaker" (BreakerState as a dict); brief=True leaves out what costs a device query or a replica call."""


class ServingProcess(InferenceSurface, Protocol):
    """The surface plus the lifecycle, for the process that owns the service (web.http_server, the Ray ingress)."""

    metrics: ServiceMetrics

    def start(self) -> None:
        """Load what serves; raises if it cannot."""

    def drain(self, timeout_s: float) -> bool:
        """Stop taking answers and wait for running ones; True if all finished in time."""

    def close(self) -> None:
        """Release everything; idempotent."""
