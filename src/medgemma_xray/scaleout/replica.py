"""One model replica: the project's own InferenceService (scheduler, KV cache, hot switch, breaker) on one GPU.

Ray Serve calls these methods; the ingress reaches them through a deployment handle whose request router is
medgemma_xray.scaleout.router.ConversationAffinityRouter. An answer streams back as small dicts: {"text": delta, "tokens": [[id,
logprob, text], ...]} while it runs, then {"stats": {...}} once, with this replica's id, so the ingress can fill
the caller's GenerationStats as if the service ran in its own process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from medgemma_xray.inference_api.types import GenerationRequest, GenerationStats
from medgemma_xray.serving.settings import Settings

logger = logging.getLogger(__name__)


def replica_name() -> str:
    """This replica's Serve id, plus its host and PID (what an operator kills or inspects)."""
    from ray import serve

    try:
        unique = serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (tests of this module)
        unique = "local"
    return f"{unique}@{os.uname().nodename}:{os.getpid()}"


class ModelReplica:
    """Deployed by medgemma_xray.scaleout.serve_app with one GPU (or, for the demo, no GPU) per replica."""

    def __init__(self, settings_overrides: dict | None = None) -> None:
        from medgemma_xray.serving.memory import keep_heap_small
        from medgemma_xray.serving.service import InferenceService

        # As the single server does: the same heap creep across switches happens in a replica's process.
        self._trimmer = keep_heap_small(logger)
        settings = Settings.from_env(**(settings_overrides or {}))
        self.name = replica_name()
        self.service = InferenceService(settings)
        self.service.start()  # raises if the model cannot load: Serve reports the replica as failed to start
        logger.info("replica %s ready (mode %s)", self.name, self.service.mode)

    async def answer(self, request: GenerationRequest, routing_key: str | None = None):
        """Stream one answer. routing_key is the router's (medgemma_xray.scaleout.router); the service never reads it."""
        del routing_key
        stats = GenerationStats()
        answer = self.service.stream_answer(request, stats)
        sent_chars, sent_tokens = 0, 0
        try:
            while True:
                text = await asyncio.to_thread(next, answer, None)
                if text is None:
                    break
                count = min(len(stats.token_texts), len(stats.token_logprobs), len(stats.token_ids))
                tokens = [
                    [stats.token_ids[i], float(stats.token_logprobs[i]), stats.token_texts[i]]
                    for i in range(sent_tokens, count)
                ]
                sent_tokens = count
                yield {"text": text[sent_chars:], "tokens": tokens}
                sent_chars = len(text)
        finally:
            answer.close()  # a caller that went away cancels the answer here too
        count = len(stats.token_ids)
        tail = [
            [stats.token_ids[i], float(stats.token_logprobs[i]), stats.token_texts[i]]
            for i in range(sent_tokens, count)
        ]
        yield {
            "tokens": tail,
            "stats": {
                "prompt_tokens": stats.prompt_tokens,
                "reused_tokens": stats.reused_tokens,
                "new_tokens": stats.new_tokens,
                "first_token_s": stats.first_token_s,
                "total_s": stats.total_s,
                "finish_reason": stats.finish_reason,
                "replica": self.name,
            },
        }

    def count_prompt_tokens(self, request: GenerationRequest, routing_key: str | None = None) -> int:
        """The ingress's limit check: this replica's tokenizer counts the prompt (serving.surface)."""
        return self.service.count_prompt_tokens(request)

    def forget(self, conversation_id: str, routing_key: str | None = None) -> None:
        self.service.forget_conversation(conversation_id)

    def info(self, target_replica: str | None = None):
        return self.service.info()

    def status(self, target_replica: str | None = None) -> dict:
        trimmer = self._trimmer
        heap = {"trim_every_s": trimmer.every_s if trimmer.running else None, "trims": trimmer.trims}
        return {"replica": self.name, **self.service.status(), "heap": heap}

    def switch(self, mode: str, target_replica: str | None = None) -> dict:
        """The hot switch on this replica (medgemma_xray.scaleout.control sends it to each one)."""
        from dataclasses import asdict

        from medgemma_xray.serving.service import SwitchError

        try:
            record = self.service.switch_to(mode, reason="operator request (Ray Serve)")
        except SwitchError as exc:
            return {"replica": self.name, "ok": False, "error": str(exc), "mode": str(self.service.mode)}
        return {"replica": self.name, "ok": True, "mode": str(self.service.mode), "switch": asdict(record)}

    def check_health(self) -> None:
        """Ray Serve's health check: the same readiness /readyz reports (model loaded, not draining)."""
        if not self.service.ready.is_set():
            raise RuntimeError(f"replica {self.name} is not ready (loading, switching out or draining)")

    def record_routing_stats(self) -> dict:
        """Serve hands this to the routers periodically: each replica's state for the ingress's status."""
        breaker = self.service.breaker.snapshot()
        return {
            "replica": self.name,
            "ready": self.service.ready.is_set(),
            "mode": str(self.service.mode) if self.service.mode else None,
            "breaker": breaker.state,
            "running": self.service._count_running(),
            "waiting": self.service._count_waiting(),
            "at": time.time(),
        }

    def __del__(self) -> None:
        service = getattr(self, "service", None)
        if service is not None:
            service.close()
        trimmer = getattr(self, "_trimmer", None)
        if trimmer is not None:
            trimmer.close()
