"""results.csv: a spreadsheet view of results.jsonl, regenerated from it (never appended), one row per record and,
for questions, one row per question. Columns are those of the tasks present. Text cells are neutralised against
formula injection (assistant.spreadsheet): a file name or an answer that starts with = or - is shown as text."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from medgemma_xray.assistant.batch.journal import write_atomically
from medgemma_xray.assistant.report_schema import REPORT_FIELDS
from medgemma_xray.assistant.spreadsheet import row_cells

CSV_NAME = "results.csv"
COMMON = ["film_id", "file", "task", "status", "error_class", "error_message", "source", "view_position", "warnings"]
GENERATION = ["new_tokens", "seconds", "tokens_per_s", "finish_reason", "confidence", "confidence_min", "lowest_span"]
GROUPS = {
    "features": ["shard", "row"],
    "report": [
        *GENERATION,
        *(f.key for f in REPORT_FIELDS),
        *(f"{f.key}_confidence" for f in REPORT_FIELDS),
        "unfilled",
        "report_json",
        "report_markdown",
        "text",
    ],
    "qa": ["question_index", "question", "answer", *GENERATION],
    "dicom-to-png": ["reason", "png", "view", "modality", "rows", "columns", "transfer_syntax"],
}


def _number(value, digits: int = 4):
    return "" if value is None else round(value, digits)


def _generation_cells(result: dict) -> dict:
    confidence = result.get("confidence") or {}
    return {
        "new_tokens": result.get("new_tokens", ""),
        "seconds": _number(result.get("seconds"), 3),
        "tokens_per_s": _number(result.get("tokens_per_s"), 2),
        "finish_reason": result.get("finish_reason") or "",
        "confidence": _number(confidence.get("mean_probability")),
        "confidence_min": _number(confidence.get("min_probability")),
        "lowest_span": confidence.get("lowest_span", ""),
    }


def record_rows(record: dict) -> list[dict]:
    film = record.get("film") or {}
    error = record.get("error") or {}
    base = {
        "film_id": record["film_id"],
        "file": record.get("file", ""),
        "task": record["task"],
        "status": record.get("status", ""),
        "error_class": error.get("class", ""),
        "error_message": error.get("message", ""),
        "source": film.get("source", ""),
        "view_position": film.get("view_position") or "",
        "warnings": " | ".join(film.get("warnings", [])),
    }
    result = record.get("result") or {}
    task = record["task"]
    if task == "features":
        return [{**base, "shard": result.get("shard", ""), "row": result.get("row", "")}]
    if task == "report" and result:
        fields = result.get("fields", {})
        confidence = result.get("confidence", {})
        row = {**base, **_generation_cells({**result, "confidence": result.get("overall_confidence")})}
        row.update({key: fields.get(key, "") for key in (f.key for f in REPORT_FIELDS)})
        for spec in REPORT_FIELDS:
            row[f"{spec.key}_confidence"] = _number((confidence.get(spec.key) or {}).get("mean_probability"))
        exports = result.get("exports", {})
        row.update(
            unfilled=" ".join(result.get("unfilled", [])),
            report_json=exports.get("json", ""),
            report_markdown=exports.get("markdown", ""),
            text=result.get("text", ""),
        )
        return [row]
    if task == "qa" and result.get("answers"):
        rows = []
        for answer in result["answers"]:
            row = {**base, "question_index": answer["index"], "question": answer["question"]}
            if "error" in answer:
                row.update(
                    status="error", error_class=answer["error"]["class"], error_message=answer["error"]["message"]
                )
            else:
                row.update(answer=answer["answer"], **_generation_cells(answer))
            rows.append(row)
        return rows
    if task == "dicom-to-png":
        return [
            {**base, **{key: result.get(key, "") for key in GROUPS["dicom-to-png"]}, "reason": record.get("reason", "")}
        ]
    return [base]


def write_csv(output_dir: Path, records: list[dict]) -> Path:
    tasks = {record["task"] for record in records}
    columns = [c for c in COMMON if c != "file" or any("file" in r for r in records)]
    if not tasks & {"features", "report", "qa"}:  # a conversion index keeps only view, modality, size, syntax
        columns = [c for c in columns if c not in ("source", "view_position", "warnings")]
    for task, group in GROUPS.items():
        if task in tasks:
            columns += [c for c in group if c not in columns]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for record in records:
        for row in record_rows(record):
            writer.writerow(row_cells(row))
    path = Path(output_dir) / CSV_NAME
    write_atomically(path, text.getvalue().encode("utf-8"))
    return path
