"""The batch loop: films in chunks ("in flight" together), each task's record appended as it finishes.

Per chunk: load every film with the UI's own loader; one vision batch for the films' features (one shard); one
call of run_requests for all their report and question requests; then each film's records. A film that fails
anywhere gets an error record for each task it had left and the run goes on, whatever the exception. Only a
KeyboardInterrupt stops the loop, and the CSV view is still regenerated on the way out. Logs never name a film.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from medgemma_xray.assistant.batch.csv_view import write_csv
from medgemma_xray.assistant.batch.dicom_png import conversion_result, looks_like_dicom
from medgemma_xray.assistant.batch.features import FeatureShards, feature_records, write_index
from medgemma_xray.assistant.batch.films import FilmFile, film_key, find_films
from medgemma_xray.assistant.batch.journal import Journal
from medgemma_xray.assistant.batch.requests import RunRequests, sequential_requests
from medgemma_xray.assistant.batch.tasks import (
    MODEL_TASKS,
    error_record,
    features_record,
    new_record,
    qa_record,
    report_record,
)
from medgemma_xray.assistant.report import report_request
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
from medgemma_xray.xray_io import load_radiograph

logger = logging.getLogger(__name__)
# Always films/s (tqdm would switch to s/film below one film a second), then the time left.
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"


# A film file -> (what the records say about it, the model's image), raising on a film the door refuses. The
# batch CLI passes its film intake's (medgemma_xray.intake: the film check, the servers' preprocessing); details
# may carry "flagged": True for a film read with the film check's warning.
ReadFilm = Callable[[Path], tuple[dict, Any]]


class BatchUsageError(ValueError):
    """The run cannot start as asked (the message says why and what to do)."""


@dataclass(frozen=True)
class BatchPlan:
    input_dir: Path
    output_dir: Path
    tasks: tuple[str, ...]
    questions: tuple[str, ...] = ()
    max_new_tokens: int = 300
    batch_size: int = 8  # films in flight at once: one vision batch, one shard, one run_requests call
    record_names: bool = True  # the file's path under the input folder in the records (never in logs)
    retry_failed: bool = False

    @property
    def questions_sha256(self) -> str:
        return hashlib.sha256("\n".join(self.questions).encode("utf-8")).hexdigest()


@dataclass
class BatchSummary:
    films: int = 0
    already_done: int = 0
    processed: int = 0
    failed: int = 0
    records: int = 0
    skipped: int = 0  # records of this run that were skipped (dicom-to-png: not a DICOM file)
    new_tokens: int = 0
    seconds: float = 0.0
    failures_by_reason: Counter = field(default_factory=Counter)  # films of the whole journal, by error class
    failed_films: int = 0  # films of the whole journal with a failed record for one of the run's tasks
    flagged_films: int = 0  # films read now although the film check found them unlike a frontal chest film

    @property
    def films_per_s(self) -> float:
        return self.processed / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        lines = [
            f"films: {self.films} found, {self.already_done} already done, {self.processed} processed now "
            f"({self.failed} failed now)",
            f"records written: {self.records} ({self.skipped} skipped); {self.seconds:.1f} s, "
            f"{self.films_per_s:.2f} films/s, {self.new_tokens} tokens generated, {self.tokens_per_s:.1f} tokens/s",
        ]
        if self.flagged_films:
            lines.append(
                f"flagged films: {self.flagged_films} do not look like frontal chest films (FILM_CHECK=warn); "
                "their answers are not meaningful (see each record's film.warnings)"
            )
        if self.failures_by_reason:
            reasons = ", ".join(f"{name} {count}" for name, count in self.failures_by_reason.most_common())
            lines.append(f"failed films in this folder: {self.failed_films}; by reason: {reasons}")
        return lines


class _Run:
    def __init__(
        self, plan: BatchPlan, journal: Journal, backend, run_requests: RunRequests | None, read_film: ReadFilm
    ) -> None:
        self.plan, self.journal, self.backend, self.read_film = plan, journal, backend, read_film
        self.run_requests = run_requests or (sequential_requests(backend) if backend is not None else None)
        self.summary = BatchSummary()
        self.failed_now: dict[str, set[str]] = {}
        self.shards = None
        if "features" in plan.tasks:
            referenced = {r["result"]["shard"] for r in feature_records(journal)}
            self.shards = FeatureShards(plan.output_dir, referenced)
        self.backend_label = ""
        if backend is not None:
            info = backend.info()
            self.backend_label = f"{info.mode} {info.precision} {info.executor} {info.model_id}"

    def todo(self, film: FilmFile) -> list[str]:
        return [task for task in self.plan.tasks if not self.journal.is_done(film.film_id, task)]

    def append(self, record: dict) -> None:
        self.journal.append(record)
        self.summary.records += 1
        self.summary.skipped += int(record.get("status") == "skipped")
        if record.get("status") == "error":
            self.failed_now.setdefault(record["film_id"], set()).add(record["error"]["class"])

    def fail(self, film: FilmFile, tasks, exc: BaseException, about: dict | None = None) -> None:
        for task in tasks:
            if not self.journal.is_done(film.film_id, task):
                self.append(error_record(film, task, exc, self.plan.record_names, about))

    # --- one chunk -------------------------------------------------------------------------------------------
    def chunk(self, films: list[FilmFile]) -> None:
        try:
            self._chunk(films)
        except Exception as exc:  # a bug of ours or a backend gone bad: recorded, and the next chunk goes on
            logger.warning("a chunk of films failed as a whole (%s); recorded, continuing", type(exc).__name__)
            for film in films:
                self.fail(film, self.todo(film), exc)

    def _chunk(self, films: list[FilmFile]) -> None:
        loaded = []  # (film, tasks left, details, model image)
        for film in films:
            tasks = self.todo(film)
            if "dicom-to-png" in tasks:
                self._convert(film)
                tasks.remove("dicom-to-png")
            if not tasks:
                continue
            try:
                details, image = self.read_film(film.path)
            except Exception as exc:
                self.fail(film, tasks, exc)
                continue
            self.summary.flagged_films += bool(details.get("flagged"))
            loaded.append((film, tasks, details, image))
        self._features([entry for entry in loaded if "features" in entry[1]])
        self._generations([entry for entry in loaded if {"report", "qa"} & set(entry[1])])

    def _convert(self, film: FilmFile) -> None:
        record = new_record(film, "dicom-to-png", self.plan.record_names)
        try:
            if not looks_like_dicom(film.path):
                record.update(status="skipped", reason="not a DICOM file")
            else:
                radiograph = load_radiograph(film.path)
                record.update(
                    status="ok", result=conversion_result(film.path, film.film_id, radiograph, self.plan.output_dir)
                )
        except Exception as exc:
            self.fail(film, ["dicom-to-png"], exc)
            return
        self.append(record)

    def _features(self, entries: list) -> None:
        if not entries:
            return
        try:
            groups = [(entries, self._embed(entries))]
        except Exception:  # find the film that broke the batch: one at a time
            groups = []
            for entry in entries:
                try:
                    groups.append(([entry], self._embed([entry])))
                except Exception as exc:
                    self.fail(entry[0], ["features"], exc, entry[2])
        shards = cast(FeatureShards, self.shards)  # made in __init__ for every plan with the features task
        for group, features in groups:
            shard = shards.write(features)
            for row, (film, _, about, _) in enumerate(group):
                self.append(features_record(film, self.plan.record_names, about, shard, row, features.shape[1:]))

    def _embed(self, entries: list):
        features = self.backend.image_features([entry[3] for entry in entries])
        if len(features) != len(entries):  # rows would belong to the wrong films
            raise RuntimeError(f"image_features returned {len(features)} rows for {len(entries)} films")
        return features

    def _generations(self, entries: list) -> None:
        if not entries:
            return
        requests: list[GenerationRequest] = []
        spans = []  # per entry: (report request index or None, qa request slice or None)
        for _film, tasks, _about, image in entries:
            report_at = None
            if "report" in tasks:
                report_at = len(requests)
                requests.append(report_request(image, self.plan.max_new_tokens))
            qa_span = None
            if "qa" in tasks:
                start = len(requests)
                requests += [
                    GenerationRequest(image, (ChatTurn("user", q),), max_new_tokens=self.plan.max_new_tokens)
                    for q in self.plan.questions
                ]
                qa_span = slice(start, len(requests))
            spans.append((report_at, qa_span))
        try:
            run_requests = cast(RunRequests, self.run_requests)  # a plan with generation tasks has a backend
            outcomes = list(run_requests(requests))
            if len(outcomes) != len(requests):
                raise RuntimeError(f"run_requests returned {len(outcomes)} outcomes for {len(requests)} requests")
        except Exception as exc:
            outcomes = [exc] * len(requests)
        for (film, _, about, _), (report_at, qa_span) in zip(entries, spans, strict=True):
            if report_at is not None:
                self._report(film, about, outcomes[report_at])
            if qa_span is not None:
                answers = outcomes[qa_span]
                self._count_tokens(answers)
                self.append(
                    qa_record(
                        film,
                        self.plan.record_names,
                        about,
                        list(self.plan.questions),
                        answers,
                        self.plan.questions_sha256,
                        self.backend_label,
                    )
                )

    def _report(self, film: FilmFile, about: dict, outcome) -> None:
        self._count_tokens([outcome])
        if isinstance(outcome, BaseException):
            self.fail(film, ["report"], outcome, about)
            return
        try:
            text, stats = outcome
            record = report_record(
                film, self.plan.record_names, about, text, stats, self.plan.output_dir, self.backend_label
            )
        except Exception as exc:
            self.fail(film, ["report"], exc, about)
        else:
            self.append(record)

    def _count_tokens(self, outcomes) -> None:
        for outcome in outcomes:
            if not isinstance(outcome, BaseException):
                self.summary.new_tokens += outcome[1].new_tokens


def _check_questions(plan: BatchPlan, journal: Journal) -> None:
    if "qa" not in plan.tasks:
        return
    if not plan.questions:
        raise BatchUsageError("the qa task needs questions: pass --questions FILE (one question per line)")
    earlier = {r["result"]["questions_sha256"] for r in journal if r["task"] == "qa" and r.get("result")}
    if earlier - {plan.questions_sha256}:
        raise BatchUsageError(
            "this output folder holds answers to a different questions file; resume with the same file, or "
            "write to a new --output"
        )


def run_batch(
    plan: BatchPlan,
    backend=None,
    run_requests: RunRequests | None = None,
    progress: bool = True,
    *,
    read_film: ReadFilm | None = None,
) -> BatchSummary:
    """Run the plan's tasks on every film under plan.input_dir not yet done in plan.output_dir. read_film: how a
    film becomes the model's input; the features, report and qa tasks need one (the CLI's goes through the film
    intake, film check included)."""
    from tqdm import tqdm

    if not plan.input_dir.is_dir():
        raise BatchUsageError(f"--input {plan.input_dir} is not a folder")
    if set(plan.tasks) & set(MODEL_TASKS) and (backend is None or read_film is None):
        raise BatchUsageError("the features, report and qa tasks need a backend and a film reader")
    started = time.perf_counter()
    with Journal.open(plan.output_dir, drop_failed=plan.retry_failed) as journal:
        _check_questions(plan, journal)
        films = find_films(plan.input_dir, film_key(plan.output_dir), exclude=plan.output_dir)
        run = _Run(plan, journal, backend, run_requests, read_film or _no_reader)
        pending = [film for film in films if run.todo(film)]
        summary = run.summary
        summary.films, summary.already_done = len(films), len(films) - len(pending)
        logger.info("batch: %d films, %d already done, tasks %s", len(films), summary.already_done, plan.tasks)
        bar = tqdm(
            total=len(films),
            initial=summary.already_done,
            unit=" films",
            file=sys.stderr,
            disable=not progress,
            dynamic_ncols=True,
            smoothing=0.3,
            bar_format=BAR_FORMAT,
        )
        try:
            for start in range(0, len(pending), max(1, plan.batch_size)):
                chunk = pending[start : start + plan.batch_size]
                run.chunk(chunk)
                summary.processed += len(chunk)
                summary.failed = len(run.failed_now)
                elapsed = time.perf_counter() - started
                bar.set_postfix(failed=summary.failed, tokens_per_s=f"{summary.new_tokens / elapsed:.1f}")
                bar.update(len(chunk))
        finally:
            bar.close()
            summary.seconds = time.perf_counter() - started
            failed: dict[str, set[str]] = {}
            for record in journal:
                if record["task"] in plan.tasks and record.get("status") == "error":
                    failed.setdefault(record["film_id"], set()).add(record["error"]["class"])
            summary.failed_films = len(failed)
            summary.failures_by_reason = Counter(name for names in failed.values() for name in names)
            write_csv(plan.output_dir, journal.records)
            if "features" in plan.tasks or any(r["task"] == "features" for r in journal):
                write_index(plan.output_dir, journal.records)
    return summary


def _no_reader(path: Path) -> tuple[dict, Any]:
    raise BatchUsageError("this run has no film reader")  # run_batch refuses model tasks without one first
