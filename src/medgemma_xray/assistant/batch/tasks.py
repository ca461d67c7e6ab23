"""One film's result records, task by task: what goes into the journal (and from there the CSV).

Every record has film_id, task and status ("ok", "error" or "skipped"); "file" (the path under the input folder)
only when the run records names. A failed record has error.class and error.message; when names are not recorded
the message is scrubbed of the file's name and path.
"""

from __future__ import annotations

from pathlib import Path

from medgemma_xray.assistant.batch.films import FilmFile
from medgemma_xray.assistant.batch.journal import write_atomically
from medgemma_xray.assistant.confidence import answer_confidence
from medgemma_xray.assistant.report import parse_report
from medgemma_xray.assistant.report_export import report_json, report_markdown
from medgemma_xray.inference_api.types import GenerationStats
from medgemma_xray.xray_io import Radiograph

MODEL_TASKS = ("features", "report", "qa")
TASKS = (*MODEL_TASKS, "dicom-to-png")
REPORTS_DIR = "reports"


def new_record(film: FilmFile, task: str, record_names: bool) -> dict:
    record: dict = {"film_id": film.film_id, "task": task}
    if record_names:
        record["file"] = film.relative
    return record


def describe_error(exc: BaseException, film: FilmFile, record_names: bool) -> dict:
    message = str(exc) or repr(exc)
    if not record_names:
        for name in sorted({str(film.path), str(film.path.resolve()), film.relative, film.path.name}, key=len)[::-1]:
            message = message.replace(name, "<film>")
    # A door's refusal (medgemma_xray.intake) carries a stable code; its class is recorded as the loader's own
    # when it wraps one (CorruptImageError, ImageTooLargeError, ...), which says more.
    code = getattr(exc, "code", None)
    cause = exc.__cause__ if code is not None and isinstance(exc.__cause__, Exception) else exc
    described = {"class": type(cause).__name__, "message": message}
    if isinstance(code, str):
        described["code"] = code
    return described


def error_record(film: FilmFile, task: str, exc: BaseException, record_names: bool, about: dict | None = None) -> dict:
    record = new_record(film, task, record_names)
    record.update(status="error", error=describe_error(exc, film, record_names))
    if about:
        record["film"] = about
    return record


def film_details(
    radiograph: Radiograph, shape: tuple[int, int] | None = None, warnings: tuple[str, ...] | None = None
) -> dict:
    """What the loader says about the film: nothing identifying (source, view, warnings, size). shape and
    warnings: the film's own where `radiograph` is a smaller copy, and the film check's warning added."""
    rows, columns = shape or radiograph.shape
    return {
        "source": radiograph.source,
        "view_position": radiograph.view_position,
        "warnings": list(radiograph.warnings if warnings is None else warnings),
        "rows": rows,
        "columns": columns,
    }


def _generation(stats: GenerationStats) -> dict:
    confidence = answer_confidence(stats.token_ids, stats.token_logprobs, stats.token_texts)
    return {
        "new_tokens": stats.new_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "seconds": stats.total_s,
        "first_token_s": stats.first_token_s,
        "tokens_per_s": stats.tokens_per_s,
        "finish_reason": stats.finish_reason,
        "confidence": confidence.to_dict() if confidence else None,
    }


def features_record(film: FilmFile, record_names: bool, about: dict, shard: str, row: int, shape) -> dict:
    record = new_record(film, "features", record_names)
    record.update(status="ok", film=about, result={"shard": shard, "row": row, "shape": list(shape)})
    return record


def report_record(
    film: FilmFile, record_names: bool, about: dict, text: str, stats: GenerationStats, output_dir: Path, backend: str
) -> dict:
    """Parse the answer, write reports/<film_id>.json and .md, and return the record."""
    report = parse_report(text, stats)
    metadata = {"film_id": film.film_id, **({"file": film.relative} if record_names else {}), "backend": backend}
    folder = output_dir / REPORTS_DIR
    folder.mkdir(exist_ok=True)
    exports = {"json": f"{REPORTS_DIR}/{film.film_id}.json", "markdown": f"{REPORTS_DIR}/{film.film_id}.md"}
    write_atomically(output_dir / exports["json"], report_json(report, metadata).encode("utf-8"))
    write_atomically(output_dir / exports["markdown"], report_markdown(report, metadata).encode("utf-8"))
    record = new_record(film, "report", record_names)
    result = {"text": text, **report.to_dict(), **_generation(stats), "backend": backend, "exports": exports}
    del result["raw_text"]  # the same as text
    record.update(status="ok", film=about, result=result)
    return record


def qa_record(
    film: FilmFile,
    record_names: bool,
    about: dict,
    questions: list[str],
    outcomes: list,
    questions_sha: str,
    backend: str,
) -> dict:
    """One record for all the questions on a film; it fails as a whole if any question failed (a resume redoes it
    with --retry_failed), and keeps the answers that did come back."""
    answers, failures = [], []
    for index, (question, outcome) in enumerate(zip(questions, outcomes, strict=True)):
        if isinstance(outcome, BaseException):
            failures.append(outcome)
            answers.append({"index": index, "question": question, "error": describe_error(outcome, film, record_names)})
        else:
            text, stats = outcome
            answers.append({"index": index, "question": question, "answer": text, **_generation(stats)})
    record = new_record(film, "qa", record_names)
    record.update(film=about, result={"questions_sha256": questions_sha, "backend": backend, "answers": answers})
    if failures:
        first = failures[0]
        record.update(status="error", error=describe_error(first, film, record_names))
    else:
        record["status"] = "ok"
    return record
