"""The scheduler's batching rules on the scripted backend (real scheduler and service threads, no model): waiting
prompts prefill together in one backend call; text is made on the output thread, not the GPU loop; the metrics
carry vLLM's names."""

from __future__ import annotations

import threading

from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats, Mode
from medgemma_xray.serving.scheduler import Scheduler
from medgemma_xray.serving.service import InferenceService
from medgemma_xray.serving.settings import Settings
from tests.support.scripted_backend import ScriptedBackend


class RecordingBackend(ScriptedBackend):
    """Records each prefill call's chunk count and the threads that detokenise; can hold the first prefill."""

    def __init__(self) -> None:
        super().__init__(Mode.PYTORCH, answer_length=4)
        self.prefill_calls: list[int] = []
        self.detokenize_threads: set[str] = set()
        self.in_prefill = threading.Event()
        self.go = threading.Event()

    def _prefill_batch_impl(self, items):
        self.prefill_calls.append(len(items))
        if len(self.prefill_calls) == 1:  # hold the first call, so the others queue up behind it
            self.in_prefill.set()
            assert self.go.wait(30)
        return super()._prefill_batch_impl(items)

    def _detokenize_impl(self, ids):
        self.detokenize_threads.add(threading.current_thread().name)
        return super()._detokenize_impl(ids)


def ask(text: str) -> GenerationRequest:
    return GenerationRequest(None, (ChatTurn("user", text),), max_new_tokens=4)


def test_waiting_prompts_prefill_together_and_text_is_made_off_the_loop():
    backend = RecordingBackend()
    scheduler = Scheduler(backend, max_active=8, max_waiting=8, name="loop-under-test")
    try:
        first = scheduler.submit(ask("first question"))
        assert backend.in_prefill.wait(30)
        others = [scheduler.submit(ask(f"question number {i}")) for i in range(3)]
        backend.go.set()
        texts = ["".join(ticket.deltas(30, 30)) for ticket in (first, *others)]
    finally:
        assert scheduler.close(30)
    assert backend.prefill_calls == [1, 3]  # the three that waited went through one packed call
    assert all(texts) and len(set(texts)) == 1
    assert backend.detokenize_threads == {"loop-under-test-output"}  # never the loop thread itself


def test_metrics_carry_vllm_names_beside_the_projects_own(tmp_path):
    settings = Settings(log_dir=tmp_path, engine_path=tmp_path)
    service = InferenceService(settings, backend_factory=lambda mode, s: RecordingBackend())
    service.start()
    try:
        service._current.backend.go.set()
        for text in ("one", "two"):
            stats = GenerationStats()
            list(service.stream_answer(ask(text), stats))
        body = service.metrics.exposition()[0].decode()
    finally:
        service.close()
    for line in (
        'vllm:time_to_first_token_seconds_count{model_name="pytorch"} 2.0',
        'vllm:e2e_request_latency_seconds_count{model_name="pytorch"} 2.0',
        'vllm:inter_token_latency_seconds_count{model_name="pytorch"} 6.0',  # 4 tokens each: 3 gaps each
        'medgemma_time_to_first_token_seconds_count{mode="pytorch"} 2.0',
        "vllm:num_requests_running 0.0",
        "vllm:num_requests_waiting 0.0",
        "vllm:prefix_cache_queries_total",
        "vllm:mm_cache_hits_total",
    ):
        assert line in body, line
