"""Batch work over a folder of chest films, resumable: features, structured reports, questions, DICOM to PNG.

  python batch_films.py --task all --input films/ --output results/ --questions questions.txt
  python batch_films.py --task dicom-to-png --input dicoms/ --output teaching/

Tasks: features (image embeddings, in shards), report (the structured report, also as JSON and Markdown per film),
qa (every question of --questions on every film), all (those three; qa only with --questions), dicom-to-png
(the UI's windowing, de-identified; needs no model).
Writes results/results.jsonl (one record per film and task, appended as each finishes) and results/results.csv
(regenerated from it). Run the same command again to resume: finished records are kept, the rest is done.
Films go through the servers' own intake, film check included: an image that is not a frontal chest film (noise,
a document, a photograph) gets an error record (class NotAChestFilm, code not_a_chest_film), or with FILM_CHECK=warn
is read and flagged.
Exit status: 0 every record ok; 1 some films failed or were flagged (see the records); 2 bad use or the backend did
not load.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

TASK_CHOICES = ("features", "report", "qa", "all", "dicom-to-png")


def read_questions(path: Path) -> tuple[str, ...]:
    """A .json list of strings, or text with one question per line (blank lines and # comments skipped)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        questions = json.loads(text)
        if not isinstance(questions, list) or not all(isinstance(q, str) for q in questions):
            raise ValueError(f"{path}: a .json questions file must hold a list of strings")
    else:
        questions = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    questions = tuple(q.strip() for q in questions if q.strip())
    if not questions:
        raise ValueError(f"{path}: no questions found (one question per line)")
    return questions


def check_questions(questions: tuple[str, ...], max_new_tokens: int) -> None:
    """Every question under the servers' own rules (web.asking): its size (MAX_PROMPT_TOKENS) and no control or
    image marker of the model's chat format. Refused before any model loads, naming the question."""
    from medgemma_xray.assistant.batch.runner import BatchUsageError
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
    from medgemma_xray.serving.settings import Settings
    from medgemma_xray.web.asking import AskLimits, AskRefused, check_turns

    limits = AskLimits.from_settings(Settings.from_env())
    for number, question in enumerate(questions, start=1):
        try:
            check_turns(GenerationRequest(None, (ChatTurn("user", question),), max_new_tokens=max_new_tokens), limits)
        except AskRefused as exc:
            raise BatchUsageError(f"question {number} of --questions: {exc}") from None


def film_reader(settings):
    """Films through the servers' own intake (medgemma_xray.intake): the same limits, preprocessing and film check.
    An image that is not a frontal chest film is refused (FILM_CHECK=refuse, the default: an error record) or read
    with a warning and flagged (FILM_CHECK=warn); either way the run exits 1. Nothing is cached: each film is read
    once."""
    from medgemma_xray.assistant.batch.tasks import film_details
    from medgemma_xray.intake import FilmIntake, IntakeConfig
    from medgemma_xray.xray_io.loader import MAX_UPLOAD_BYTES

    # A film file may be as large as the loader allows (a server's upload limit is smaller, for its network).
    intake = FilmIntake(IntakeConfig.from_settings(settings, cache_bytes=0, max_bytes=MAX_UPLOAD_BYTES))

    def read(path: Path) -> tuple[dict, object]:
        film = intake.read_path(path)
        details = film_details(film.film, shape=film.full_shape, warnings=film.warnings)
        if film.verdict is not None:
            details["film_check"] = {"score": round(film.verdict.distance, 1), "threshold": film.verdict.threshold}
        details["flagged"] = not film.plausible
        return details, film.model_image

    return read


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=TASK_CHOICES, required=True)
    parser.add_argument("--input", type=Path, required=True, help="folder of films, read recursively")
    parser.add_argument("--output", type=Path, required=True, help="results folder; reuse it to resume")
    parser.add_argument("--questions", type=Path, help="questions file for qa (one per line, or a .json list)")
    parser.add_argument("--mode", choices=["pytorch", "trt"], default="pytorch")
    parser.add_argument("--model_path", type=Path)
    parser.add_argument("--engine_path", type=Path)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--max_new_tokens", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=8, help="films in flight at once (one vision batch)")
    parser.add_argument(
        "--file_names",
        choices=["record", "omit"],
        help="put each film's path in the records (default: record; omit for dicom-to-png)",
    )
    parser.add_argument("--retry_failed", action="store_true", help="redo the films recorded as failed")
    parser.add_argument(
        "--one_by_one",
        action="store_true",
        help="generate one answer at a time instead of through the batching scheduler",
    )
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from medgemma_xray.assistant.batch.films import DamagedOutputError
    from medgemma_xray.assistant.batch.journal import FolderBusyError
    from medgemma_xray.assistant.batch.runner import BatchPlan, BatchUsageError, run_batch
    from medgemma_xray.inference_api.types import MAX_MAX_NEW_TOKENS

    tasks = ("features", "report", *(("qa",) if args.questions else ())) if args.task == "all" else (args.task,)
    file_names = args.file_names or ("omit" if args.task == "dicom-to-png" else "record")
    try:
        if not args.input.is_dir():
            raise BatchUsageError(f"--input {args.input} is not a folder")
        if not 1 <= args.batch_size <= 256:
            raise BatchUsageError(f"--batch_size must be 1..256, got {args.batch_size}")
        if not 1 <= args.max_new_tokens <= MAX_MAX_NEW_TOKENS:
            raise BatchUsageError(f"--max_new_tokens must be 1..{MAX_MAX_NEW_TOKENS}, got {args.max_new_tokens}")
        if args.task == "qa" and not args.questions:
            raise BatchUsageError("--task qa needs --questions FILE (one question per line)")
        questions = read_questions(args.questions) if args.questions else ()
        check_questions(questions, args.max_new_tokens)
    except (BatchUsageError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plan = BatchPlan(
        input_dir=args.input,
        output_dir=args.output,
        tasks=tasks,
        questions=questions,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        record_names=file_names == "record",
        retry_failed=args.retry_failed,
    )

    backend, read_film = None, None
    if args.task != "dicom-to-png":
        from medgemma_xray.serving.factory import create_backend
        from medgemma_xray.serving.settings import Settings

        try:
            settings = Settings.from_env(model_path=args.model_path, engine_path=args.engine_path, device=args.device)
            read_film = film_reader(settings)
            backend = create_backend(args.mode, settings)
        except Exception as exc:
            print(f"error: the {args.mode} backend did not load: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        if backend.info().is_demo:
            logging.warning("demo model: %s", backend.info().demo_notice)
    scheduler, run_requests = None, None
    if backend is not None and not args.one_by_one:
        from medgemma_xray.assistant.batch.requests import scheduled_requests
        from medgemma_xray.serving.scheduler import Scheduler

        in_flight = args.batch_size * (("report" in tasks) + len(questions) * ("qa" in tasks))
        scheduler = Scheduler(backend, max_active=in_flight, max_waiting=in_flight, name="batch-scheduler")
        run_requests = scheduled_requests(scheduler)
    try:
        summary = run_batch(plan, backend, run_requests, progress=not args.no_progress, read_film=read_film)
    except (BatchUsageError, FolderBusyError, DamagedOutputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if scheduler is not None:
            scheduler.close()
        if backend is not None:
            backend.close()
    for line in summary.lines():
        print(line)
    print(f"results: {args.output / 'results.jsonl'} and {args.output / 'results.csv'}")
    return 1 if summary.failed_films or summary.flagged_films else 0


if __name__ == "__main__":
    raise SystemExit(main())
