"""Folders of films in batch: a structured report per film and/or image features, one bad file never stops the run.

Results are written as they are produced (reports one file each, the summary row by row), so an interrupted run
keeps everything finished so far; a rerun skips films whose report already exists.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assistant.case import Case, stream_structured_report
from xray_io import ImageInputError, load_radiograph
from xray_io.preprocess import model_input_image

logger = logging.getLogger(__name__)
SUMMARY_FIELDS = ("file", "status", "source", "view_position", "warnings", "error")


@dataclass
class BatchResult:
    processed: int = 0
    failed: int = 0
    skipped: int = 0


def film_files(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and not p.name.startswith("."))


def cumulative(backend):
    """Adapt a backend's text deltas to the service's cumulative-text stream (what the report builder expects)."""

    def stream_answer(request) -> Iterator[str]:
        text = ""
        for delta in backend.stream_generate(request):
            text += delta
            yield text

    return stream_answer


def process_folder(backend, input_dir: Path, output_dir: Path, reports: bool, features: bool,
                   max_new_tokens: int, batch_size: int = 8, progress=None) -> BatchResult:  # fmt: skip
    output_dir.mkdir(parents=True, exist_ok=True)
    report_dir = output_dir / "reports"
    if reports:
        report_dir.mkdir(exist_ok=True)
    result = BatchResult()
    pending_images, pending_names, feature_rows, feature_names = [], [], [], []

    def flush_features() -> None:
        if pending_images:
            feature_rows.append(backend.image_features(pending_images))
            feature_names.extend(pending_names)
            pending_images.clear()
            pending_names.clear()

    with (output_dir / "summary.csv").open("w", newline="") as summary_file:
        summary = csv.DictWriter(summary_file, fieldnames=SUMMARY_FIELDS)
        summary.writeheader()
        for path in film_files(input_dir):
            relative = str(path.relative_to(input_dir))
            row = {"file": relative, "status": "ok", "source": "", "view_position": "", "warnings": "", "error": ""}
            try:
                film = load_radiograph(path)
                row.update(source=film.source, view_position=film.view_position or "",
                           warnings=" | ".join(film.warnings))  # fmt: skip
                image = model_input_image(film)
                report_path = report_dir / (relative.replace("/", "__") + ".md")
                if reports and report_path.exists():
                    row["status"] = "skipped (report exists)"
                    result.skipped += 1
                elif reports:
                    updates = stream_structured_report(Case(film, image), cumulative(backend), max_new_tokens)
                    text = list(updates)[-1]  # the last update is the whole report
                    # The report's own name maps it to its film; its text carries no file name, so it can be shared.
                    report_path.write_text(f"<!-- {film.source} -->\n{text}\n")
                if features:
                    pending_images.append(image)
                    pending_names.append(relative)
                    if len(pending_images) >= batch_size:
                        flush_features()
                result.processed += 1
            except ImageInputError as exc:
                row.update(status="error", error=str(exc))
                result.failed += 1
            summary.writerow(row)
            summary_file.flush()
            if progress:
                progress()
    if features:
        flush_features()
        if feature_rows:
            np.save(output_dir / "features.npy", np.concatenate(feature_rows).astype(np.float32))
            (output_dir / "features_index.csv").write_text(
                "row,file\n" + "".join(f"{i},{n}\n" for i, n in enumerate(feature_names))
            )
    logger.info("batch done: %d processed, %d failed, %d skipped", result.processed, result.failed, result.skipped)
    return result
