"""The scheduler over the fast path on the demo checkpoint (CPU): steps queued one ahead give the tokens that
answering each question alone, step by step, gives; and a prompt that breaks a packed prefill fails alone."""

from __future__ import annotations

import threading

import pytest

from medgemma_xray.inference_api.errors import RequestError
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.serving.scheduler import Scheduler
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image
from tests.pytorch_backend.conftest import QUESTIONS


@pytest.fixture(scope="module")
def films():
    return [model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in range(3)]


@pytest.fixture(scope="module")
def backend(demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    fast = FastTorchInference(demo_model_dir, device="cpu", slots=4, max_sequence=1024, max_resident_conversations=0)
    yield fast
    fast.close()


def alone(backend, request) -> list[int]:
    """The synchronous path: host-fed steps, each read before the next is launched."""
    backend.overlaps = False
    try:
        stats = GenerationStats()
        backend.generate(request, stats)
        return stats.token_ids
    finally:
        del backend.overlaps  # back to the class's own value


def test_overlapped_steps_give_the_step_by_step_tokens(backend, films):
    requests = [
        GenerationRequest(film, (ChatTurn("user", question),), max_new_tokens=10 + 4 * index)
        for index, (film, question) in enumerate(zip([*films, films[0]], [*QUESTIONS, QUESTIONS[2]], strict=True))
    ]
    expected = [alone(backend, request) for request in requests]
    assert backend.overlaps
    scheduler = Scheduler(backend, max_active=4, max_waiting=8)
    try:
        stats = [GenerationStats() for _ in requests]
        tickets = [scheduler.submit(request, s) for request, s in zip(requests, stats, strict=True)]
        for ticket in tickets:
            "".join(ticket.deltas(300, 300))
        profile = scheduler.turn_profile()
    finally:
        assert scheduler.close(60)
    assert [s.token_ids for s in stats] == expected
    assert profile["launches_read_late"] > 0  # steps were read only after the next turn's launch was queued


class FailingPrefill:
    """Wraps the backend's prefill launch: the first call waits until `go` (so the next prompts queue up and share
    one packed call); any call whose chunks include a prompt with `poison` in it raises, as a kernel would."""

    def __init__(self, backend, poison: str) -> None:
        self.backend, self.poison = backend, poison
        self.original = backend._launch_prefill_impl
        self.calls: list[int] = []
        self.holding, self.go = threading.Event(), threading.Event()

    def __call__(self, items):
        self.calls.append(len(items))
        if len(self.calls) == 1:
            self.holding.set()
            assert self.go.wait(60)
        for _, prompt, _, _, _ in items:
            if _contains(prompt.ids, self.poison_ids):
                raise IndexError("index 300 is out of bounds for dimension 0 with size 256")
        return self.original(items)

    @property
    def poison_ids(self) -> list[int]:
        return self.backend.processor.tokenizer(self.poison, add_special_tokens=False)["input_ids"]


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_a_prompt_that_breaks_the_packed_prefill_fails_alone(backend, films):
    good = GenerationRequest(films[1], (ChatTurn("user", QUESTIONS[1]),), max_new_tokens=8)
    expected = alone(backend, good)
    failing = FailingPrefill(backend, "zebra crossing")
    backend._launch_prefill_impl = failing
    scheduler = Scheduler(backend, max_active=4, max_waiting=8)
    try:
        first = scheduler.submit(GenerationRequest(films[0], (ChatTurn("user", QUESTIONS[0]),), max_new_tokens=4))
        assert failing.holding.wait(60)
        bad = scheduler.submit(GenerationRequest(films[2], (ChatTurn("user", "zebra crossing?"),), max_new_tokens=8))
        stats = GenerationStats()
        other = scheduler.submit(good, stats)
        failing.go.set()
        "".join(first.deltas(300, 300))
        with pytest.raises(RequestError, match="could not be processed"):
            "".join(bad.deltas(300, 300))
        "".join(other.deltas(300, 300))
    finally:
        del backend._launch_prefill_impl
        assert scheduler.close(60)
    assert failing.calls[:2] == [1, 2]  # the two shared one packed call, which failed; then each went alone
    assert stats.token_ids == expected


def test_image_markers_in_a_question_are_refused_and_the_class_goes_on(backend, films):
    hostile = GenerationRequest(films[0], (ChatTurn("user", "What is this? " + "<image_soft_token>" * 40),), 8)
    good = GenerationRequest(films[1], (ChatTurn("user", QUESTIONS[0]),), max_new_tokens=8)
    expected = alone(backend, good)
    scheduler = Scheduler(backend, max_active=4, max_waiting=8)
    try:
        bad, stats = scheduler.submit(hostile), GenerationStats()
        other = scheduler.submit(good, stats)
        with pytest.raises(RequestError, match="image placeholder tokens"):
            "".join(bad.deltas(300, 300))
        "".join(other.deltas(300, 300))
    finally:
        assert scheduler.close(60)
    assert stats.token_ids == expected
