"""/teaching's exports: the report (Markdown and DICOM SR, with its clinical context) and the session (CSV and a
PDF handout). Files are named by date, their own short id and the case, never by an uploaded file's name, and
written private (0600) into fresh folders of the server's private cache, under the upload quota and the cache's age
limit (web.export_folders). The report's typed fields and the model's text are scrubbed of the session's identifiers,
as the session's CSV and PDF are.
"""

from __future__ import annotations

import datetime
import os
import re
import uuid
from pathlib import Path

from medgemma_xray.web.page_errors import refused, shown
from medgemma_xray.web.page_wiring import PageEvents
from medgemma_xray.web.teaching_context import TeachingPage, current_round, logger, session_of

EVENTS = PageEvents()
EXPORT_BYTES = 1 << 20  # room one export needs (a handout PDF of a long round is a few hundred KiB)


def export_label(title: str) -> str:
    """A case's title as a file-name label (lowercase letters, digits and hyphens, at most 32): exports are named
    by the case, never by an uploaded file's name."""
    label = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:32].strip("-")
    return label or "case"


def export_stem(kind: str, label: str, day: datetime.date | None = None) -> str:
    """2026-12-03_teaching-report-3f9a_right-pleural-effusion: the date, the export's short id and the case, so two
    exports never share a name (the files of one export share the stem)."""
    return f"{(day or datetime.date.today()).isoformat()}_{kind}-{uuid.uuid4().hex[:4]}_{label}"


def _write_private(folder: Path, name: str, data: bytes) -> str:
    path = folder / name
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    return str(path)


def _export_folder(page: TeachingPage, prefix: str) -> Path:
    """A fresh folder for one export, under the upload quota and the cache's age limit (web.export_folders)."""
    from medgemma_xray.web.export_folders import ExportSpaceFull, new_export_folder

    settings = page.settings
    try:
        return new_export_folder(
            page.export_root,
            prefix,
            max_age_s=settings.cache_max_age_s,
            quota_bytes=settings.upload_cache_max_mb << 20,
            incoming_bytes=EXPORT_BYTES,
        )
    except ExportSpaceFull as exc:
        raise refused(str(exc), logger, "teaching") from exc


@EVENTS.on(["report_button.click"],
           inputs=["indication", "comparison", "recommendation", "identifiers", "student_name", "session"],
           outputs=["report_md", "report_sr"], api_name="teaching_report")  # fmt: skip
def export_report(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    from medgemma_xray.assistant.report import parse_report
    from medgemma_xray.teaching.report_context import ClinicalContext, TeachingReport
    from medgemma_xray.teaching.session_export import scrub
    from medgemma_xray.teaching.sr import sr_bytes

    _, _, round_ = current_round(values)
    if not round_.revealed:
        raise refused("Reveal the case first: the report is the model's read.", logger, "teaching")
    forbidden = session_of(values).value.forbidden  # scrubbed as the session's CSV and PDF are
    context = ClinicalContext(
        *(scrub(values[name] or "", forbidden) for name in ("indication", "comparison", "recommendation"))
    )
    from medgemma_xray.web.teaching_answers import byline

    report = TeachingReport(
        context,
        parse_report(scrub(round_.model_report, forbidden)),
        scrub(f"{round_.title} · {byline(values['student_name'])}", forbidden),
    )
    folder = _export_folder(page, "teaching-report-")
    allowed = bool(values["identifiers"]) and page.settings.sr_include_identifiers
    try:
        sr = sr_bytes(report, round_.display.dicom_identity, include_identifiers=allowed)
        markdown = report.markdown().encode("utf-8", "replace")
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    label = export_label(round_.title)
    stem = export_stem("teaching-report", label)
    md = _write_private(folder, f"{stem}.md", markdown)
    dcm = _write_private(folder, f"{stem}-sr.dcm", sr)
    return {"report_md": gr.update(value=md, visible=True), "report_sr": gr.update(value=dcm, visible=True)}


@EVENTS.on(["export_button.click"], inputs=["student_name", "session"], outputs=["session_csv", "session_pdf"],
           api_name="teaching_export")  # fmt: skip
def export_session(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    from medgemma_xray.teaching.session_export import SessionInfo, session_csv, session_pdf

    held = session_of(values).value
    if not held.records:
        raise refused("Nothing to export yet: reveal at least one case.", logger, "teaching")
    folder = _export_folder(page, "teaching-session-")
    records = list(held.records)
    info = SessionInfo(student=values["student_name"] or "", day=datetime.date.today(), first_case=held.dropped + 1)
    label = export_label(records[0].title) if len(records) == 1 else f"{len(records)}-cases"
    stem = export_stem("teaching-session", label, info.day)
    csv_path = _write_private(folder, f"{stem}.csv", session_csv(records, held.forbidden, info).encode("utf-8"))
    pdf_path = _write_private(folder, f"{stem}.pdf", session_pdf(records, held.forbidden, info=info))
    return {
        "session_csv": gr.update(value=csv_path, visible=True),
        "session_pdf": gr.update(value=pdf_path, visible=True),
    }
