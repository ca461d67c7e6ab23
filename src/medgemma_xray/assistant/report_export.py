"""A structured report as JSON and Markdown files: for the UI's download buttons and for batch output.

Exports carry the report, its confidence and the caller's metadata, never a file name: the caller decides what
metadata to pass (model id, mode), and must not pass anything identifying. Files written for download are private
to this user account: 0600 files in a fresh 0700 folder, removed by remove_report_files.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from medgemma_xray.assistant.confidence import CONFIDENCE_EXPLANATION, Confidence
from medgemma_xray.assistant.report import StructuredReport
from medgemma_xray.assistant.report_schema import REPORT_FIELDS

EXPORT_FORMAT = "medgemma-xray-report/1"
DISCLAIMER = "For education and research only. Not a medical device, not for diagnosis."
DEFAULT_STEM = "chest-xray-report"
_LABEL = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def export_stem(report_id: str, film_label: str, day: datetime.date | None = None) -> str:
    """The exports' file name without extension, e.g. 2026-12-01_report-3f9a_film-2: the date, the report's short
    id and the film's non-identifying label, so two reports never share a name. Refuses anything else as a label
    (a file name, which may hold a patient's name, must never reach it)."""
    for name, value in (("report id", report_id), ("film label", film_label)):
        if not _LABEL.fullmatch(value):
            raise ValueError(f"{name} must be 1-32 lowercase letters, digits or hyphens, got {value!r}")
    return f"{(day or datetime.date.today()).isoformat()}_report-{report_id}_{film_label}"


def report_json(report: StructuredReport, metadata: dict | None = None) -> str:
    """The report as a JSON document (UTF-8 text, keys in schema order)."""
    document = {
        "format": EXPORT_FORMAT,
        "disclaimer": DISCLAIMER,
        "metadata": dict(metadata or {}),
        "labels": {f.key: f.label for f in REPORT_FIELDS},
        **report.to_dict(),
        "confidence_explanation": CONFIDENCE_EXPLANATION,
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _percent(confidence: Confidence | None) -> str:
    return f" _(confidence {confidence.mean_probability:.0%})_" if confidence else ""


def _indented(text: str) -> str:
    """A field's text inside a Markdown list item: continuation lines indented so they stay in the item."""
    return "\n  ".join(line.rstrip() for line in text.splitlines())


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in text, so the model's text cannot end it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _engineering(metadata: dict) -> list[str]:
    """The figures behind the report (its id, the model and executor, tokens, timing), folded under the report:
    a reader reads the report first; the figures stay one click away here and in full in the JSON."""
    if not metadata:
        return []
    lines = ["<details><summary>How this report was made (model, executor, tokens, timing)</summary>", ""]
    lines += [f"- {key}: {value}" for key, value in metadata.items()]
    return [*lines, "", "</details>", ""]


def report_markdown(report: StructuredReport, metadata: dict | None = None) -> str:
    """The report as Markdown, in a report's reading order: view and technique, findings by region, impression;
    then confidence, and folded away the engineering figures (metadata) and the model's raw text."""
    missing = "_(not stated)_"
    by_key = {f.key: f for f in REPORT_FIELDS}
    lines = ["# Chest X-ray report", "", f"> {DISCLAIMER}", ""]
    for key in ("view", "technique"):
        value = report.fields[key]
        lines.append(
            f"**{by_key[key].label}:** {_indented(value) if value else missing}{_percent(report.confidence.get(key))}  "
        )
    lines += ["", "## Findings", ""]
    for spec in REPORT_FIELDS:
        if spec.region is None:
            continue
        value = report.fields[spec.key]
        lines.append(
            f"- **{spec.label}:** {_indented(value) if value else missing}{_percent(report.confidence.get(spec.key))}"
        )
    impression = report.fields["impression"]
    lines += ["", "## Impression", "", (impression or missing) + _percent(report.confidence.get("impression")), ""]
    lines += ["## Confidence", ""]
    if report.overall is None:
        lines.append("No token probabilities were recorded for this report.")
    else:
        overall = report.overall
        lines.append(
            f"Whole report: {overall.mean_probability:.0%} (lowest token {overall.min_probability:.0%}; least sure at "
            f"“{overall.lowest_span}”, {overall.lowest_span_probability:.0%})."
        )
    lines += ["", CONFIDENCE_EXPLANATION, ""]
    if report.unfilled:
        labels = ", ".join(by_key[key].label for key in report.unfilled)
        lines += [f"Fields the model's text did not fill: {labels}.", ""]
    lines += _engineering(dict(metadata or {}))
    fence = _fence(report.raw_text)
    lines += [
        "<details><summary>The model's text as written</summary>",
        "",
        f"{fence}text",
        report.raw_text.rstrip("\n"),
        fence,
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ReportFiles:
    folder: Path
    json_path: Path
    markdown_path: Path


def _write_private(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


def write_report_files(
    report: StructuredReport,
    base_dir: str | os.PathLike | None = None,
    metadata: dict | None = None,
    stem: str = DEFAULT_STEM,
) -> ReportFiles:
    """Write the JSON and Markdown exports (stem.json, stem.md; see export_stem) into a new private folder (0700)
    under base_dir (default: the system temp folder; pass the server's private upload cache where there is one).
    Give the paths to gr.DownloadButton: the browser saves them under these names."""
    if Path(stem).name != stem or stem.startswith("."):
        raise ValueError(f"an export stem is a bare file name, got {stem!r}")
    folder = Path(tempfile.mkdtemp(prefix="report-", dir=base_dir))  # mkdtemp creates it 0700
    os.chmod(folder, 0o700)
    files = ReportFiles(folder, folder / f"{stem}.json", folder / f"{stem}.md")
    _write_private(files.json_path, report_json(report, metadata).encode("utf-8"))
    _write_private(files.markdown_path, report_markdown(report, metadata).encode("utf-8"))
    return files


def remove_report_files(files: ReportFiles | None) -> None:
    """Delete an export folder (a new report, a new case, the session's end). Missing is fine."""
    if files is not None:
        shutil.rmtree(files.folder, ignore_errors=True)
