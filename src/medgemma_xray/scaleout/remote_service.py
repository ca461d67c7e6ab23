"""The ingress's view of the model: InferenceService's surface (what the UI and the OpenAI API call), answered by
the model replicas through a Ray Serve deployment handle. The UI and API code are the single server's, unchanged.

Failures keep the service's vocabulary: a replica that dies mid-answer is a ServiceUnavailable with a message that
says to ask again (only answers in flight on it are lost; the conversation continues on another replica), and a
replica's RequestError or ServiceUnavailable is re-raised as itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator
from dataclasses import asdict

from medgemma_xray.inference_api.errors import RequestError
from medgemma_xray.inference_api.types import GenerationRequest, GenerationStats
from medgemma_xray.serving.breaker import BreakerState
from medgemma_xray.serving.metrics import ServiceMetrics
from medgemma_xray.serving.service import ServiceUnavailable
from medgemma_xray.serving.settings import Settings

logger = logging.getLogger(__name__)

REPLICA_LOST = (
    "The model replica answering this question stopped (only answers in flight on it are lost). "
    "Ask again: the conversation continues on another replica."
)


def routing_key(request: GenerationRequest) -> str | None:
    """The conversation id: its KV lives on one replica. A request without one is spread by Serve's router: the
    replicas keep no image or prefix cache across conversations yet, so pinning a film to one replica would only
    pile a class asking about one film onto one GPU."""
    return request.conversation_id


def unwrap_replica_error(exc: BaseException) -> BaseException:
    """A replica's own error as itself; a dead or unreachable replica as a retryable ServiceUnavailable."""
    from ray import exceptions

    if isinstance(exc, exceptions.RayTaskError):
        cause = exc.cause
        if isinstance(cause, (RequestError, ServiceUnavailable)):
            return cause
        if isinstance(cause, exceptions.RayActorError):
            return ServiceUnavailable(REPLICA_LOST)
        return RuntimeError(f"the model replica failed: {type(cause).__name__}")
    if isinstance(exc, (exceptions.RayActorError, exceptions.ActorUnavailableError)):
        return ServiceUnavailable(REPLICA_LOST)
    return exc


class ReplicaSetService:
    """InferenceService's surface over N replicas. `stats.replica` names the replica that answered."""

    def __init__(self, handle, settings: Settings) -> None:
        self.settings = settings
        self._handle = handle
        self.metrics = ServiceMetrics()
        self.metrics.bind_queue(lambda: 0, lambda: 0)
        self.started_at = time.time()
        self.ready = threading.Event()
        self._closing = threading.Event()
        self._waiter: threading.Thread | None = None
        self._info = None

    def start(self) -> None:
        """Become ready once a replica answers (Serve starts the others meanwhile), on a thread that close() joins:
        the ingress is built on Serve's event loop, where a blocking call is refused."""
        self._waiter = threading.Thread(target=self._wait_for_a_replica, name="wait-for-replica", daemon=True)
        self._waiter.start()

    def _wait_for_a_replica(self) -> None:
        while not self._closing.is_set():
            try:
                self._info = self._handle.info.remote().result(timeout_s=10)
            except Exception as exc:  # no replica up yet: Serve is still starting them
                logger.info("waiting for a model replica (%s)", type(exc).__name__)
                self._closing.wait(1.0)
                continue
            self.ready.set()
            self.metrics.ready.set(1)
            return

    @property
    def mode(self):
        return self._info.mode if self._info is not None else None

    def info(self):
        return self._info

    def stream_answer(
        self, request: GenerationRequest, stats: GenerationStats | None = None
    ) -> Generator[str, None, None]:
        stats = stats if stats is not None else GenerationStats()
        if not self.ready.is_set():
            raise ServiceUnavailable("The model is not loaded yet; try again in a moment.")
        started = time.perf_counter()
        chunks = self._handle.options(stream=True).answer.remote(request, routing_key=routing_key(request))
        text = ""
        try:
            for chunk in chunks:
                for token_id, logprob, token_text in chunk.get("tokens", ()):
                    stats.token_ids.append(token_id)
                    stats.token_logprobs.append(logprob)
                    stats.token_texts.append(token_text)
                    stats.token_times.append(time.perf_counter())
                remote = chunk.get("stats")
                if remote is not None:
                    for name in ("prompt_tokens", "reused_tokens", "new_tokens", "finish_reason", "total_s"):
                        setattr(stats, name, remote[name])
                    stats.replica = remote["replica"]
                if chunk.get("text"):
                    if stats.first_token_s is None:
                        stats.first_token_s = time.perf_counter() - started
                    text += chunk["text"]
                    yield text
        except GeneratorExit:
            chunks.cancel()
            raise
        except Exception as exc:
            error = unwrap_replica_error(exc)
            if error is exc:
                raise
            if isinstance(error, ServiceUnavailable) and str(error) == REPLICA_LOST:
                logger.warning("a model replica stopped during an answer: %s", type(exc).__name__)
            raise error from None
        label = self._info.metric_label if self._info is not None else "none"
        self.metrics.observe_request(label, time.perf_counter() - started, stats.first_token_s, stats.new_tokens)

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        """serving.surface.InferenceSurface.count_prompt_tokens, by a replica's own tokenizer (the film stays here)."""
        from dataclasses import replace

        if not self.ready.is_set():
            raise ServiceUnavailable("The model is not loaded yet; try again in a moment.")
        try:
            return int(self._handle.count_prompt_tokens.remote(replace(request, image=None)).result(timeout_s=30))
        except Exception as exc:
            error = unwrap_replica_error(exc)
            if error is exc:  # a timeout or a handle error: no replica answered
                error = ServiceUnavailable("No model replica answered in time; try again in a moment.")
            raise error from None

    def image_features(self, images):
        raise RequestError("image features are served by each replica, not through the ingress")

    def prepare_film(self, image) -> None:
        """Nothing to do ahead here: the film crosses to a replica with its question (the replica that holds the
        conversation is known only then), and that replica's scheduler prepares it on submit."""

    def forget_conversation(self, conversation_id: str) -> None:
        # Not awaited: Gradio may call this on its event loop, and a dead replica took the conversation with it.
        self._handle.forget.remote(conversation_id, routing_key=conversation_id)

    def replica_stats(self) -> list[dict]:
        from medgemma_xray.scaleout.control import replica_stats

        return replica_stats()

    def status(self, brief: bool = False) -> dict:
        """serving.surface.InferenceSurface.status. The breaker is open when any replica's is (each replica keeps
        its own); the full status lists each replica. brief=True still asks the replicas for their breakers."""
        replicas = self.replica_stats()
        info = self._info
        status = {
            "ready": self.ready.is_set(),
            "mode": str(self.mode) if self.mode else None,
            "mode_label": info.mode_label if info is not None else "none",
            "breaker": asdict(_any_open_breaker(replicas, self.settings.breaker_failures)),
        }
        if brief:
            return status
        return {
            **status,
            "replicas": replicas,
            "requests": self.metrics.totals(),
            "latency": self.metrics.latency_percentiles(),
        }

    def drain(self, timeout_s: float) -> bool:
        self.ready.clear()
        return True

    def close(self) -> None:
        self.ready.clear()
        self._closing.set()
        if self._waiter is not None:
            self._waiter.join(15)


def _any_open_breaker(replicas: list[dict], threshold: int) -> BreakerState:
    """One breaker for the badge: open when any replica's is."""
    opened = [str(stats.get("replica")) for stats in replicas if stats.get("breaker") == "open"]
    if not opened:
        return BreakerState("closed", 0, threshold, None, None, 0)
    return BreakerState("open", 0, threshold, f"open on replica(s) {', '.join(opened)}", None, len(opened))
