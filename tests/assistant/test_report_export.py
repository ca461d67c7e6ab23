"""Report exports: JSON that reads back, Markdown a teacher can hand out, private files for the download button."""

from __future__ import annotations

import json
import math
import stat
from datetime import date

import pytest

from medgemma_xray.assistant.report import parse_report
from medgemma_xray.assistant.report_export import (
    DISCLAIMER,
    EXPORT_FORMAT,
    export_stem,
    remove_report_files,
    report_json,
    report_markdown,
    write_report_files,
)

TEXT = "View: PA\nLungs: hazy ```left``` base\nImpression: pneumonia"


class Stats:
    token_texts = [
        "View",
        ":",
        " PA",
        "\n",
        "Lungs",
        ":",
        " hazy ```left``` base",
        "\n",
        "Impression",
        ":",
        " pneumonia",
    ]
    token_ids = list(range(len(token_texts)))
    token_logprobs = [math.log(p) for p in (0.99, 0.99, 0.9, 0.99, 0.99, 0.99, 0.4, 0.99, 0.99, 0.99, 0.7)]


def test_json_export_reads_back_with_every_field_unfilled_ones_and_confidence():
    report = parse_report(TEXT, Stats())
    document = json.loads(report_json(report, {"model": "demo"}))
    assert document["format"] == EXPORT_FORMAT and document["disclaimer"] == DISCLAIMER
    assert document["metadata"] == {"model": "demo"}
    assert document["fields"]["lungs"] == "hazy ```left``` base" and document["fields"]["pleura"] == ""
    assert document["unfilled"] == ["technique", "pleura", "heart_mediastinum", "bones", "lines_devices"]
    assert abs(document["confidence"]["lungs"]["mean_probability"] - 0.4) < 1e-9
    assert document["overall_confidence"]["tokens"] == 11
    assert document["raw_text"] == TEXT and "not the probability" in document["confidence_explanation"]


def test_markdown_export_has_sections_marks_missing_fields_and_fences_the_raw_text_safely():
    markdown = report_markdown(parse_report(TEXT, Stats()))
    assert markdown.startswith("# Chest X-ray report\n\n> For education and research only.")
    assert "**View:** PA _(confidence 90%)_" in markdown
    assert "- **Lungs:** hazy ```left``` base _(confidence 40%)_" in markdown
    assert "- **Pleura:** _(not stated)_" in markdown and "**Technique:** _(not stated)_" in markdown
    assert "## Impression\n\npneumonia _(confidence 70%)_" in markdown
    assert (
        "Fields the model's text did not fill: Technique, Pleura, Heart and mediastinum, Bones, Lines and devices."
        in markdown
    )
    # The raw text holds a ``` run, so the fence around it is longer and the text cannot close it.
    assert f"````text\n{TEXT}\n````" in markdown
    assert "No token probabilities" in report_markdown(parse_report(TEXT))


@pytest.mark.parametrize(
    ("report_id", "label"), [("3f9a", "Jane Doe.dcm"), ("../x", "film-1"), ("3f9a", ""), ("3f9a", "film/2")]
)
def test_export_names_take_only_short_labels(report_id, label):
    with pytest.raises(ValueError, match="lowercase letters, digits or hyphens"):
        export_stem(report_id, label)


def test_download_files_are_private_and_removable(tmp_path):
    report = parse_report(TEXT, Stats())
    files = write_report_files(report, base_dir=tmp_path, metadata={"model": "demo"})
    assert files.folder.parent == tmp_path
    assert stat.S_IMODE(files.folder.stat().st_mode) == 0o700
    for path in (files.json_path, files.markdown_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert files.json_path.read_text() == report_json(report, {"model": "demo"})
    assert files.markdown_path.read_text() == report_markdown(report, {"model": "demo"})
    assert files.json_path.name == "chest-xray-report.json"  # never a name derived from the upload
    named = write_report_files(report, base_dir=tmp_path, stem=export_stem("3f9a", "film-2", date(2026, 12, 1)))
    assert (named.json_path.name, named.markdown_path.name) == (
        "2026-12-01_report-3f9a_film-2.json",
        "2026-12-01_report-3f9a_film-2.md",
    )
    remove_report_files(named)
    second = write_report_files(report, base_dir=tmp_path)
    assert second.folder != files.folder  # one folder per export: concurrent sessions never share a file
    remove_report_files(files)
    remove_report_files(files)  # idempotent
    assert not files.folder.exists() and second.json_path.exists()


def test_the_report_reads_as_a_report_first_and_folds_the_engineering_figures():
    """View, technique, findings and impression lead; report_id, executor, tokens and seconds sit in a folded
    details block after them (and stay in the JSON)."""
    metadata = {"report_id": "3f9a", "executor": "pytorch", "generated_tokens": 11, "seconds": 0.5}
    report = parse_report(TEXT, Stats())
    markdown = report_markdown(report, metadata)
    order = [markdown.index(text) for text in ("**View:**", "## Findings", "## Impression", "<details><summary>How")]
    assert order == sorted(order), markdown
    head = markdown.split("## Impression", 1)[0]
    assert not any(key in head for key in metadata), head
    folded = markdown.split("<details><summary>How", 1)[1].split("</details>", 1)[0]
    assert all(f"- {key}: {value}" in folded for key, value in metadata.items())
    assert json.loads(report_json(report, metadata))["metadata"] == metadata
