"""The batch runner on the demo model, in process: a failure of any kind stays with its film and its task."""

from __future__ import annotations

import pytest

from medgemma_xray.assistant.batch.features import load_features
from medgemma_xray.assistant.batch.journal import Journal
from medgemma_xray.assistant.batch.requests import scheduled_requests, sequential_requests
from medgemma_xray.assistant.batch.runner import BatchPlan, BatchUsageError, run_batch
from medgemma_xray.assistant.report_schema import REPORT_PROMPT
from medgemma_xray.cli.batch import film_reader
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.pytorch_backend.eager import TorchInference
from medgemma_xray.serving.settings import Settings

BAD_FILM = "b.png"  # the film whose vision batch fails in the backend
BAD_IMAGES: list = []  # the model images read from it (kept alive, so identity is theirs alone)


def read_film(path):
    """The batch CLI's own reader (the film intake, film check included), marking the bad film's image."""
    details, image = READER(path)
    if path.name == BAD_FILM:
        BAD_IMAGES.append(image)
    return details, image


READER = film_reader(Settings())


class FlakyVision(TorchInference):
    """The real demo backend, with a fault injected: the vision tower fails on one film (as out-of-memory)."""

    def _image_features_impl(self, images):
        if any(image is bad for image in images for bad in BAD_IMAGES):
            raise MemoryError("injected: out of memory in the vision tower")
        return super()._image_features_impl(images)


class SchedulerFault(Exception):
    """Raised by the fault-injecting run_requests below; no code in the project knows this type."""


@pytest.fixture(scope="module")
def backend(random_model_dir):
    model = FlakyVision(random_model_dir, device="cpu")
    yield model
    model.close()


def test_failures_of_any_type_are_recorded_per_film_and_task_and_the_run_goes_on(tmp_path, backend):
    films = tmp_path / "films"
    films.mkdir()
    sizes = {"a.png": 256, "b.png": 300, "c.png": 256, "d.png": 256}
    for seed, (name, side) in enumerate(sizes.items()):
        (films / name).write_bytes(png_bytes(quantize(chest_phantom(side, 224, seed=seed), 8)))
    real = sequential_requests(backend)
    calls = []

    def run_requests(requests):
        calls.append(len(requests))
        if len(calls) == 2:
            raise SchedulerFault("the whole second call failed")
        outcomes = real(requests)
        if len(calls) == 1:  # the first film's report fails alone
            assert requests[0].turns[0].text == REPORT_PROMPT
            outcomes[0] = KeyError("injected")
        return outcomes

    plan = BatchPlan(
        films,
        tmp_path / "out",
        ("features", "report", "qa"),
        questions=("Any effusion?",),
        max_new_tokens=3,
        batch_size=2,
    )
    summary = run_batch(plan, backend, run_requests, progress=False, read_film=read_film)
    assert calls == [4, 4]  # two films in flight per call: report + one question each
    with Journal.open(plan.output_dir) as journal:
        status = {(r["file"], r["task"]): (r["status"], (r.get("error") or {}).get("class")) for r in journal}
    assert status == {
        ("a.png", "features"): ("ok", None),
        ("a.png", "report"): ("error", "KeyError"),
        ("a.png", "qa"): ("ok", None),
        ("b.png", "features"): ("error", "MemoryError"),  # its batch was retried film by film: a.png kept its row
        ("b.png", "report"): ("ok", None),
        ("b.png", "qa"): ("ok", None),
        ("c.png", "features"): ("ok", None),
        ("c.png", "report"): ("error", "SchedulerFault"),
        ("c.png", "qa"): ("error", "SchedulerFault"),
        ("d.png", "features"): ("ok", None),
        ("d.png", "report"): ("error", "SchedulerFault"),
        ("d.png", "qa"): ("error", "SchedulerFault"),
    }
    assert summary.failed_films == 4 and summary.records == 12
    assert summary.failures_by_reason == {"KeyError": 1, "MemoryError": 1, "SchedulerFault": 2}
    ids, features = load_features(plan.output_dir, journal.records)
    assert features.shape == (3, 256, 128)

    # A resume with --retry_failed redoes exactly the failed records, once.
    retried = run_batch(
        BatchPlan(**{**plan.__dict__, "retry_failed": True}), backend, real, progress=False, read_film=read_film
    )
    assert retried.processed == 4 and retried.failed_films == 1  # b.png's vision still fails
    with Journal.open(plan.output_dir) as journal:
        keys = [(r["file"], r["task"]) for r in journal]
        assert len(keys) == len(set(keys)) == 12
        assert [k for k in keys if journal.records[keys.index(k)]["status"] == "error"] == [("b.png", "features")]


def test_qa_needs_questions_and_a_resume_refuses_other_questions(tmp_path, backend):
    films = tmp_path / "films"
    films.mkdir()
    (films / "a.png").write_bytes(png_bytes(quantize(chest_phantom(256, 224, seed=1), 8)))
    with pytest.raises(BatchUsageError, match="needs questions"):
        run_batch(BatchPlan(films, tmp_path / "out", ("qa",)), backend, progress=False, read_film=read_film)
    run_batch(
        BatchPlan(films, tmp_path / "out", ("qa",), questions=("One?",), max_new_tokens=2),
        backend,
        progress=False,
        read_film=read_film,
    )
    with pytest.raises(BatchUsageError, match="different questions file"):
        run_batch(
            BatchPlan(films, tmp_path / "out", ("qa",), questions=("Two?",)),
            backend,
            progress=False,
            read_film=read_film,
        )


def test_the_batching_scheduler_gives_the_answers_of_one_by_one(tmp_path, random_model_dir):
    """The runner's batched path (serving's scheduler, all of a chunk's requests in flight) against the reference
    path (one request after another): greedy decoding, so the same text; confidence within 1e-5."""
    from medgemma_xray.pytorch_backend.eager import TorchInference
    from medgemma_xray.serving.scheduler import Scheduler

    films = tmp_path / "films"
    films.mkdir()
    for seed in range(3):
        (films / f"f{seed}.png").write_bytes(png_bytes(quantize(chest_phantom(256, 224, seed=seed), 8)))
    backend = TorchInference(random_model_dir, device="cpu")
    scheduler = Scheduler(backend, max_active=9, max_waiting=9)
    try:
        results = {}
        for name, run_requests in (
            ("one_by_one", sequential_requests(backend)),
            ("scheduled", scheduled_requests(scheduler)),
        ):
            plan = BatchPlan(
                films,
                tmp_path / name,
                ("report", "qa"),
                questions=("Effusion?", "Heart size?"),
                max_new_tokens=5,
                batch_size=3,
            )
            summary = run_batch(plan, backend, run_requests, progress=False, read_film=read_film)
            assert summary.failed_films == 0 and summary.new_tokens == 3 * 3 * 5
            with Journal.open(plan.output_dir) as journal:
                results[name] = {(r["file"], r["task"]): r["result"] for r in journal}
    finally:
        scheduler.close()
        backend.close()
    assert results["one_by_one"].keys() == results["scheduled"].keys()
    for key, reference in results["one_by_one"].items():
        batched = results["scheduled"][key]
        pairs = (
            [(reference, batched)]
            if key[1] == "report"
            else list(zip(reference["answers"], batched["answers"], strict=True))
        )
        for expected, got in pairs:
            assert got.get("text", got.get("answer")) == expected.get("text", expected.get("answer"))
            confidence = "overall_confidence" if key[1] == "report" else "confidence"
            assert got[confidence]["mean_probability"] == pytest.approx(
                expected[confidence]["mean_probability"], abs=1e-5
            )
