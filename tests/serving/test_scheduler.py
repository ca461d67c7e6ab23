"""The batching scheduler with real threads on the demo model's fast path (CPU, fp32): answers join and leave the
running batch mid-decode and still get exactly their unbatched tokens; cancellation frees the slot; a full queue
is refused at once; an evicted conversation is re-prefilled and answers the same."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.serving.scheduler import Scheduler, SchedulerBusyError
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend(random_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    model = FastTorchInference(random_model_dir, device="cpu", slots=3, max_sequence=1024, max_resident_conversations=1)
    yield model
    model.close()


@pytest.fixture(scope="module")
def films():
    return [model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in range(3)]


def unbatched(backend, request) -> list[int]:
    stats = GenerationStats()
    backend.generate(request, stats)
    return stats.token_ids


def collect(ticket) -> str:
    return "".join(ticket.deltas(60, 60))


@contextlib.contextmanager
def decode_held_until(backend, joined: threading.Event):
    """Hold every decode step until `joined` is set (an answer's first token comes from its prefill). On a fast
    idle host the 40-token answer used to finish before the submitting thread had even hashed and preprocessed the
    second film (40 steps in 0.18 s on this 2-core host, 2026-12-02), so whether the short answer joined a running
    batch depended on the machine's speed."""
    if not backend.overlaps:
        decode = backend._decode_impl

        def held(*args, **kwargs):
            if not joined.wait(timeout=60):
                raise TimeoutError("the second answer was never submitted")
            return decode(*args, **kwargs)

        backend._decode_impl = held
        try:
            yield
        finally:
            backend._decode_impl = decode
        return
    # Steps queued ahead: hold the reading of decode steps (their launch does not wait for the host), so the
    # prefill's first token still goes out while no decoded token does.
    complete = backend.complete

    def held_complete(launch):
        if launch.kind == "decode" and not joined.wait(timeout=60):
            raise TimeoutError("the second answer was never submitted")
        return complete(launch)

    backend.complete = held_complete
    try:
        yield
    finally:
        del backend.complete  # the class's own method again


def test_answers_join_and_leave_mid_decode_with_their_unbatched_tokens(backend, films):
    long = GenerationRequest(films[0], (ChatTurn("user", "Findings?"),), max_new_tokens=40)
    short = GenerationRequest(films[1], (ChatTurn("user", "Is the heart enlarged?"),), max_new_tokens=6)
    expected_long, expected_short = unbatched(backend, long), unbatched(backend, short)
    scheduler = Scheduler(backend, max_active=3, max_waiting=8)
    joined = threading.Event()
    try:
        with decode_held_until(backend, joined):
            long_stats, short_stats = GenerationStats(), GenerationStats()
            first = scheduler.submit(long, long_stats)
            deltas = first.deltas(60, 60)
            next(deltas)  # the long answer's first token (from its prefill); its decode waits for the join
            second = scheduler.submit(short, short_stats)  # joins the running batch at the next turn
            joined.set()
            collect(second)
            assert not first.finished_at, "the short answer left the batch while the long one was still running"
            "".join(deltas)
        assert long_stats.token_ids == expected_long and short_stats.token_ids == expected_short
        assert second.admitted_at > first.admitted_at and second.finished_at < first.finished_at
    finally:
        joined.set()
        scheduler.close(10)


def test_a_cancelled_answer_frees_its_slot_at_the_next_turn(backend, films):
    scheduler = Scheduler(backend, max_active=3, max_waiting=8)
    try:
        request = GenerationRequest(films[0], (ChatTurn("user", "Findings?"),), max_new_tokens=500)
        stats = GenerationStats()
        ticket = scheduler.submit(request, stats)
        deltas = ticket.deltas(60, 60)
        next(deltas)
        ticket.cancel()  # the browser tab closed
        "".join(deltas)
        assert stats.finish_reason == "cancelled" and stats.new_tokens < 500
        deadline = time.monotonic() + 10
        while len(backend._free_rows) != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(backend._free_rows) == 3
    finally:
        scheduler.close(10)


def test_a_full_queue_is_refused_at_once(backend, films):
    """Refused while the running answer cannot move: its decode is held until after the refusal, so a submit that
    waited for room would never return (a timed bound said less: 30 tokens take 0.1 s on a fast idle host)."""
    scheduler = Scheduler(backend, max_active=1, max_waiting=1)
    refused = threading.Event()
    try:
        with decode_held_until(backend, refused):
            request = GenerationRequest(films[0], (ChatTurn("user", "Findings?"),), max_new_tokens=30)
            running = scheduler.submit(request)
            next(running.deltas(60, 60))  # admitted; its first token came from the prefill, its decode is held
            waiting = scheduler.submit(request)
            with pytest.raises(SchedulerBusyError):
                scheduler.submit(request)
            assert not running.finished_at and running.stats.new_tokens <= 1
            refused.set()
            for ticket in (running, waiting):
                collect(ticket)
    finally:
        refused.set()
        scheduler.close(10)


def test_concurrent_conversations_beyond_the_resident_limit_answer_the_same(backend, films):
    """Three users, one resident conversation: follow-ups of evicted conversations are re-prefilled."""
    scheduler = Scheduler(backend, max_active=3, max_waiting=8)
    results, errors = {}, []

    def user(index: int) -> None:
        try:
            film = films[index]
            first = GenerationRequest(film, (ChatTurn("user", "Findings?"),), 6, conversation_id=f"user-{index}")
            answer = collect(scheduler.submit(first))
            turns = (*first.turns, ChatTurn("assistant", answer), ChatTurn("user", "And the heart?"))
            stats = GenerationStats()
            collect(scheduler.submit(GenerationRequest(film, turns, 6, conversation_id=f"user-{index}"), stats))
            results[index] = (turns, stats)
        except Exception as exc:  # counted: the test fails on any
            errors.append(repr(exc))

    try:
        threads = [threading.Thread(target=user, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        scheduler.close(10)
    assert errors == [] and len(results) == 3
    for index, (turns, stats) in results.items():
        assert stats.token_ids == unbatched(backend, GenerationRequest(films[index], turns, 6))
    assert len(backend.resident_conversations) <= 1
    for index in range(3):
        backend.forget(f"user-{index}")
