"""The service's bookkeeping, fast: leases, the breaker's fallback, timeouts and queue limits, with the real scheduler
and service driving a scripted backend through the backend_factory seam. Each test is one defect of the audit."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from medgemma_xray.inference_api.errors import RequestError
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats, Mode
from medgemma_xray.serving.service import InferenceService, ServiceUnavailable
from medgemma_xray.serving.settings import Settings
from tests.support.scripted_backend import ScriptedBackend, scripted_factory


@pytest.fixture(autouse=True)
def fresh_counters():
    ScriptedBackend.loads.clear()
    ScriptedBackend.instances.clear()
    yield


def request(text: str = "Findings?", **kwargs) -> GenerationRequest:
    return GenerationRequest(None, (ChatTurn("user", text),), **kwargs)


def make_service(tmp_path, factory=None, **overrides) -> InferenceService:
    settings = Settings(log_dir=tmp_path, engine_path=tmp_path, **overrides)
    return InferenceService(settings, backend_factory=factory or scripted_factory())


def answer(service, text="Findings?") -> str:
    updates = list(service.stream_answer(request(text)))
    return updates[-1] if updates else ""


def answer_in_background(service) -> None:
    def run() -> None:
        with contextlib.suppress(ServiceUnavailable):  # expected for the answers these tests leave hanging
            answer(service)

    threading.Thread(target=run, daemon=True).start()


def wait_until(condition, timeout_s: float = 60) -> None:
    """Wait for a state the test needs (an answer running, one waiting), not for a time that might not suffice."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the service never reached the state the test needs"
        time.sleep(0.01)


def backends(mode: Mode) -> list[ScriptedBackend]:
    return [backend for backend in ScriptedBackend.instances if backend.mode is mode]


def test_a_refused_lease_leaves_no_count_behind(tmp_path):
    """Defect 1: a lease refused with ServiceUnavailable used to leak +1 on the queue gauge every time."""
    service = make_service(tmp_path)
    for _ in range(3):
        with pytest.raises(ServiceUnavailable, match="not loaded yet"):
            answer(service)
    service.start()
    assert answer(service) == "abcdefgh"
    service.drain(1.0)
    with pytest.raises(ServiceUnavailable, match="shutting down"):
        answer(service)
    assert service._total_leases() == 0
    body = service.metrics.exposition()[0].decode()
    assert "medgemma_requests_waiting 0.0" in body and "medgemma_requests_running 0.0" in body
    service.close()


def test_breaker_trip_loads_pytorch_once_and_close_releases_every_backend(tmp_path):
    """Defect 2: failing TensorRT answers in flight during the automatic switch loaded a second PyTorch model, and
    the replaced standby was never closed."""
    service = make_service(tmp_path, inference_mode=Mode.TRT, generation_concurrency=8, breaker_failures=2)
    service.start()
    trt = backends(Mode.TRT)[0]
    trt.failures = 10**6
    results, errors = [], []

    def ask(index: int) -> None:
        try:
            results.append(answer(service, f"question {index}"))
        except Exception as exc:  # counted: the test fails on any
            errors.append(repr(exc))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    deadline = time.monotonic() + 10
    while service.mode is not Mode.PYTORCH and time.monotonic() < deadline:
        time.sleep(0.01)
    assert errors == [] and results == ["abcdefgh"] * 8  # every failed TensorRT answer was answered on PyTorch
    assert service.mode is Mode.PYTORCH and service.breaker.snapshot().state == "open"
    assert ScriptedBackend.loads[Mode.PYTORCH] == 1
    service.close()
    deadline = time.monotonic() + 10
    while any(b.closed_count == 0 for b in ScriptedBackend.instances) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [b.closed_count for b in ScriptedBackend.instances] == [1, 1]


def test_a_fallback_answer_holds_a_lease_so_drain_waits_for_it(tmp_path):
    """Defect 3: the fallback answer streamed without a lease, so a drain could stop the server under it."""
    factory = scripted_factory(step_delay_s=0.05)
    service = make_service(tmp_path, factory=factory, inference_mode=Mode.TRT, keep_both_backends=True)
    service.start()
    backends(Mode.TRT)[0].failures = 1
    service.switch_to("pytorch")  # load PyTorch as the standby, then come back
    service.switch_to("trt")
    backends(Mode.TRT)[0].failures = 1
    done = threading.Event()
    threading.Thread(target=lambda: (answer(service), done.set()), daemon=True).start()
    time.sleep(0.2)  # the TensorRT attempt failed; the answer now streams on PyTorch
    assert not done.is_set()
    assert service.drain(0.05) is False  # the fallback answer is still running and holds a lease
    assert service.drain(10) is True and done.is_set()
    service.close()


def test_internal_value_errors_are_engine_failures_and_request_errors_are_not(tmp_path):
    """Defect 4: any ValueError was taken for the user's mistake, so engine bugs skipped the breaker."""
    service = make_service(tmp_path, inference_mode=Mode.TRT)
    service.start()
    trt = backends(Mode.TRT)[0]
    trt.internal_value_errors = 1
    assert answer(service) == "abcdefgh"  # answered on PyTorch
    snapshot = service.breaker.snapshot()
    assert snapshot.consecutive_failures == 1 and "ValueError: operands could not be broadcast" in snapshot.last_failure
    trt.max_sequence = 20
    with pytest.raises(RequestError, match="exceeds this model's maximum"):
        answer(service, "a question far too long for a twenty-token context")
    assert service.breaker.snapshot().consecutive_failures == 1  # the user's error did not count
    service.close()


def test_a_hung_engine_call_is_bounded_by_the_breaker_timeout(tmp_path):
    """Defect 5: the timeout was measured after the answer ended, so a hung call was never bounded."""
    service = make_service(tmp_path, inference_mode=Mode.TRT, breaker_timeout_s=0.5)
    service.start()
    trt = backends(Mode.TRT)[0]
    trt.hang.set()
    started = time.monotonic()
    assert answer(service) == "abcdefgh"  # the fallback answered
    assert time.monotonic() - started < 30  # bounded by the 0.5 s breaker timeout: the hang itself never ends
    snapshot = service.breaker.snapshot()
    assert snapshot.consecutive_failures == 1 and "AnswerTimeoutError" in snapshot.last_failure
    trt.released.set()
    service.close()


def test_answers_beyond_the_concurrency_wait_their_turn_and_decode_together(tmp_path):
    """Defect 6: decoder slots were fixed at 2 and a third answer could wait forever; waiting counted as slowness."""
    service = make_service(tmp_path, factory=scripted_factory(step_delay_s=0.01), generation_concurrency=3)
    service.start()
    results = []
    threads = [threading.Thread(target=lambda: results.append(answer(service))) for _ in range(7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == ["abcdefgh"] * 7
    batches = backends(Mode.PYTORCH)[0].decode_batches
    assert max(batches) == 3  # three answers decoded in one batched call, never more than the setting
    service.close()


def test_a_full_queue_says_busy_at_once(tmp_path):
    service = make_service(tmp_path, generation_concurrency=1, queue_size=1)
    service.start()
    backend = backends(Mode.PYTORCH)[0]
    backend.hang.set()
    answer_in_background(service)  # runs (and hangs)
    wait_until(lambda: service._count_running() == 1)
    answer_in_background(service)  # waits
    wait_until(lambda: service._count_waiting() == 1)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable, match="busy"):
        answer(service)
    assert time.monotonic() - started < 30  # at once: waiting would last the request timeout, 300 s
    backend.released.set()
    service.close()


def test_a_waiting_answer_gives_up_after_the_request_timeout(tmp_path):
    service = make_service(tmp_path, generation_concurrency=1, request_timeout_s=0.3)
    service.start()
    backend = backends(Mode.PYTORCH)[0]
    backend.hang.set()
    answer_in_background(service)
    time.sleep(0.1)
    with pytest.raises(ServiceUnavailable, match="waited 0.3 s for a free slot.*retry in a minute"):
        answer(service)
    backend.released.set()
    service.close()


def test_a_closed_stream_frees_its_slot(tmp_path):
    service = make_service(tmp_path, factory=scripted_factory(answer_length=10_000, step_delay_s=0.001))
    service.start()
    stream = service.stream_answer(request())
    next(stream)
    stream.close()  # the browser tab went away
    deadline = time.monotonic() + 5
    while service._count_running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service._count_running() == 0
    stats = GenerationStats()
    for _ in service.stream_answer(request(), stats):
        pass
    assert stats.finish_reason == "length"
    service.close()


def test_a_hot_switch_drops_the_cached_conversations_of_the_backend_it_retires(tmp_path):
    service = make_service(tmp_path, keep_both_backends=True)
    service.start()
    pytorch = backends(Mode.PYTORCH)[0]
    for conversation in ("a", "b"):
        list(service.stream_answer(request(conversation_id=conversation)))
    assert sorted(pytorch.resident_conversations) == ["a", "b"] and pytorch.free_slots == 62
    service.switch_to("trt")
    assert pytorch.resident_conversations == [] and pytorch.free_slots == 64  # standby: its KV memory is free
    list(service.stream_answer(request(conversation_id="c")))
    assert backends(Mode.TRT)[0].resident_conversations == ["c"]
    service.switch_to("pytorch")  # back: TensorRT is kept (keep_both) but holds nothing; PyTorch caches again
    assert backends(Mode.TRT)[0].resident_conversations == []
    list(service.stream_answer(request(conversation_id="d")))
    assert pytorch.resident_conversations == ["d"]
    service.close()


def test_a_fallback_that_finishes_loading_after_close_leaves_no_backend_unclosed(tmp_path):
    """The breaker's fallback switch runs on its own thread. It used to be a daemon nobody joined, and close() did
    not take the switch lock: a PyTorch load that finished after close() was installed as current and never
    closed. Now close() waits for the load (or refuses it afterwards), and joins the thread."""
    loading, release = threading.Event(), threading.Event()
    inner = scripted_factory()

    def slow_pytorch(mode, settings):
        if Mode.parse(mode) is Mode.PYTORCH:
            loading.set()
            release.wait(10)
        return inner(mode, settings)

    service = make_service(tmp_path, factory=slow_pytorch, inference_mode=Mode.TRT, breaker_failures=1)
    service.start()
    backends(Mode.TRT)[0].failures = 10**6
    answer_in_background(service)  # fails on TensorRT, trips the breaker: the fallback starts loading PyTorch
    assert loading.wait(10), "the breaker's fallback never started loading PyTorch"
    closer = threading.Thread(
        target=lambda: service.close(timeout_s=0.2) if _takes_timeout(service) else service.close()
    )
    closer.start()
    closer.join(5)
    release.set()  # the load finishes after close() gave up waiting for it
    deadline = time.monotonic() + 10
    owned = getattr(service, "_workers", set())
    while time.monotonic() < deadline and (closer.is_alive() or any(w.is_alive() for w in owned)):
        time.sleep(0.01)
    if not owned:  # code without an owner for the thread: give the fallback's switch a moment to finish
        time.sleep(0.5)
    workers_left = [w.name for w in owned if w.is_alive()]
    assert not workers_left, f"service threads still running after close: {workers_left}"
    unclosed = [b.mode for b in ScriptedBackend.instances if b.closed_count == 0]
    assert not unclosed, f"backends never closed: {unclosed}"
    assert service.mode is None


def _takes_timeout(service) -> bool:
    import inspect

    return "timeout_s" in inspect.signature(service.close).parameters
