"""medgemma_xray.teaching.sr, medgemma_xray.teaching.report_context and medgemma_xray.teaching.session_export: the DICOM SR round-trips through pydicom;
the session's CSV and PDF show every case; no export carries an uploaded file's name or a DICOM identifier."""

from __future__ import annotations

import csv
import datetime
import io
import shutil
import subprocess

import numpy as np
import pydicom
import pytest

from medgemma_xray.assistant.report import parse_report
from medgemma_xray.demo_model.teaching import structured_report
from medgemma_xray.intake import FilmIntake, IntakeConfig
from medgemma_xray.phantoms.films import dicom_bytes, png_bytes, quantize
from medgemma_xray.phantoms.findings import sample_labels
from medgemma_xray.phantoms.labelled import labelled_phantom
from medgemma_xray.teaching.model_read import model_read
from medgemma_xray.teaching.report_context import ClinicalContext, TeachingReport
from medgemma_xray.teaching.rounds import upload_names
from medgemma_xray.teaching.scoring import read_from_labels, score_read
from medgemma_xray.teaching.session_export import CaseRecord, SessionInfo, session_csv, session_pdf
from medgemma_xray.teaching.sr import BASIC_TEXT_SR, sr_bytes
from medgemma_xray.teaching.viewer import display_film, thumbnail_png
from tests.conftest import ARTIFACTS

PATIENT = {"patient_name": "Doe^Jane", "patient_id": "MRN-77123"}
UPLOAD_NAME = "Doe_Jane_MRN-77123_chest.dcm"
INTAKE = FilmIntake(IntakeConfig(film_check="off"))


def read_display_film(data: bytes):
    """(the case's film, the viewer's film) as the teaching page reads an upload: the intake's one decode."""
    film, values = INTAKE.read_with_values(data)
    return film.film, display_film(values, film.source, film.key)


def _identified_film():
    phantom = labelled_phantom(5)
    data = dicom_bytes(quantize(phantom.film, 12), bits_stored=12, window=(2048, 4096), pixel_spacing_mm=0.8, **PATIENT)
    return phantom.labels, *read_display_film(data)


def _report(labels) -> TeachingReport:
    context = ClinicalContext("Cough and fever.", "None available.", "Repeat the film after treatment.")
    return TeachingReport(context, parse_report(structured_report(labels)))


def _walk(sequence, depth=0):
    for item in sequence:
        yield depth, item
        if "ContentSequence" in item:
            yield from _walk(item.ContentSequence, depth + 1)


def test_the_sr_round_trips_through_pydicom():
    labels, _, display = _identified_film()
    report = _report(labels)
    dataset = pydicom.dcmread(io.BytesIO(sr_bytes(report, display.dicom_identity)))
    assert dataset.SOPClassUID == BASIC_TEXT_SR and dataset.Modality == "SR"
    assert dataset.ConceptNameCodeSequence[0].CodeValue == "18748-4" and dataset.ValueType == "CONTAINER"
    items = list(_walk(dataset.ContentSequence))
    assert {item.ValueType for _, item in items} == {"CONTAINER", "TEXT"}  # what a Basic Text SR allows
    assert {item.RelationshipType for _, item in items} == {"CONTAINS"}
    texts = {item.ConceptNameCodeSequence[0].CodeMeaning: [] for _, item in items}
    for _, item in items:
        if item.ValueType == "TEXT":
            texts[item.ConceptNameCodeSequence[0].CodeMeaning].append(item.TextValue)
    sections = dict(report.sections())
    assert texts["Indications for Procedure"] == ["Cough and fever."]
    assert texts["Procedure Description"] == ["None available."]
    assert texts["Impression"] == [sections["Impression"]]
    assert texts["Recommendation"] == ["Repeat the film after treatment."]
    assert f"Lungs: {sections['Lungs']}" in texts["Finding"] and len(texts["Finding"]) == 7
    # The SR's findings read back to the same scored read as the model's text.
    findings_text = "\n".join(texts["Finding"] + [f"Impression: {texts['Impression'][0]}"])
    assert model_read(findings_text) == model_read(structured_report(labels))


def test_the_sr_is_anonymous_unless_the_operator_allows_and_the_film_has_identifiers():
    labels, _, display = _identified_film()
    identity = display.dicom_identity
    assert identity["PatientName"] == "Doe^Jane"
    anonymous = sr_bytes(_report(labels), identity)
    dataset = pydicom.dcmread(io.BytesIO(anonymous))
    assert str(dataset.PatientName) == "" and dataset.PatientID == "" and dataset.AccessionNumber == ""
    assert dataset.StudyInstanceUID != identity["StudyInstanceUID"]
    assert "CurrentRequestedProcedureEvidenceSequence" not in dataset
    for value in identity.values():
        if value != identity.get("SOPClassUID"):
            assert value.encode() not in anonymous, value
    allowed = pydicom.dcmread(io.BytesIO(sr_bytes(_report(labels), identity, include_identifiers=True)))
    assert str(allowed.PatientName) == "Doe^Jane" and allowed.PatientID == "MRN-77123"
    assert allowed.StudyInstanceUID == identity["StudyInstanceUID"]
    evidence = allowed.CurrentRequestedProcedureEvidenceSequence[0].ReferencedSeriesSequence[0]
    assert evidence.ReferencedSOPSequence[0].ReferencedSOPInstanceUID == identity["SOPInstanceUID"]
    _, png_display = read_display_film(png_bytes(quantize(labelled_phantom(5).film, 8)))
    from_png = pydicom.dcmread(io.BytesIO(sr_bytes(_report(labels), png_display.dicom_identity, True)))
    assert str(from_png.PatientName) == "" and from_png.PatientID == ""


def _records(count: int = 3, notes: str = "", thumbnail: bytes = b"") -> list[CaseRecord]:
    records = []
    for number in range(count):
        labels = sample_labels(number)
        student = read_from_labels(labels)
        student["cardiothoracic_ratio"] = 0.9  # one field wrong
        records.append(
            CaseRecord(
                title=f"Phantom case {number + 1:02d}",
                history=f"history line {number + 1}",
                student_read=student,
                student_notes=notes,
                model_read=model_read(structured_report(labels)),
                model_report=structured_report(labels),
                key=labels,
                questions=(("Is there a pleural effusion?", "No pleural effusion."),),
                teaching_points=("Measure the ratio.",),
                thumbnail=thumbnail,
            )
        )
    return records


def test_the_session_csv_has_one_row_per_case_and_one_column_per_field():
    records = _records()
    info = SessionInfo("Ana Lopez", datetime.date(2026, 12, 3))
    rows = list(csv.DictReader(io.StringIO(session_csv(records, info=info))))
    assert [row["title"] for row in rows] == ["Phantom case 01", "Phantom case 02", "Phantom case 03"]
    for row, record in zip(rows, records, strict=True):
        assert (row["date"], row["student"]) == ("2026-12-03", "Ana Lopez")
        student = score_read(record.student_read, record.key)
        model = score_read(record.model_read, record.key)
        assert row["student_score"].startswith(f"{student.total - 1}/{student.total} ")
        assert row["model_score"].startswith(f"{model.summary()} ")
        assert row["cardiothoracic ratio (key)"] == f"{record.key.heart.cardiothoracic_ratio:g}"
        assert row["cardiothoracic ratio (student)"] == "0.9 (WRONG)"
        assert row["cardiothoracic ratio (model)"].endswith("(right)") or "WRONG" in row["cardiothoracic ratio (model)"]
        for mark in student.marks:  # every scored field has its own three cells
            assert row[f"{mark.label} (key)"] and row[f"{mark.label} (student)"] and row[f"{mark.label} (model)"]
        assert "marks" not in row
        assert row["questions_and_answers"] == "Q: Is there a pleural effusion? A: No pleural effusion."


def test_fields_left_empty_are_not_assessed_in_the_csv():
    labels = sample_labels(0)
    record = CaseRecord(title="Phantom case 01", student_read={"cardiothoracic_ratio": 0.9}, key=labels,
                        model_read=model_read(structured_report(labels)))  # fmt: skip
    row = next(csv.DictReader(io.StringIO(session_csv([record]))))
    assert row["rotated (student)"] == "not assessed" and row["cardiothoracic ratio (student)"] == "0.9 (WRONG)"
    assert row["student_score"].startswith("0/1 (")


@pytest.mark.skipif(not shutil.which("pdftoppm"), reason="poppler-utils (pdftoppm) not installed: setup_env.sh --dev")
def test_the_pdf_handout_renders_and_names_every_case(tmp_path):
    """Every case's heading sits on the page of its marks table (KeepTogether), with the film's thumbnail; the
    date and the student are on the first page and in every page's foot."""
    _, _, display = _identified_film()
    pdf = tmp_path / "handout.pdf"
    info = SessionInfo("Ana Lopez", datetime.date(2026, 12, 3))
    pdf.write_bytes(session_pdf(_records(5, thumbnail=thumbnail_png(display)), info=info))
    subprocess.run(["pdftoppm", "-png", "-r", "50", str(pdf), str(tmp_path / "page")], check=True)
    from PIL import Image

    pages = sorted(tmp_path.glob("page*.png"))
    first = np.asarray(Image.open(pages[0]).convert("L"))
    assert first.shape[0] > first.shape[1] and (first < 128).mean() > 0.01  # A4 portrait, with text on it
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(pages[0], ARTIFACTS / "teaching_handout_page1.png")
    text = subprocess.run(["pdftotext", str(pdf), "-"], check=True, capture_output=True, text=True).stdout
    assert "2026-12-03" in text and "Student: Ana Lopez" in text
    page_texts = text.split("\f")
    for number in range(1, 6):
        heading = f"Case {number}: Phantom case {number:02d}"
        page = next(p for p in page_texts if heading in p)
        after = page.split(heading, 1)[1]
        assert "Field" in after and "cardiothoracic ratio" in after, f"{heading}: its table starts on another page"
        assert "2026-12-03" in page, "every page's foot carries the date"
    images = subprocess.run(["pdfimages", "-list", str(pdf)], check=True, capture_output=True, text=True).stdout
    assert len(images.strip().splitlines()) - 2 == 5, images  # one thumbnail per case


def test_no_export_carries_a_file_name_or_a_dicom_identifier():
    labels, film, display = _identified_film()
    forbidden = upload_names(f"/tmp/gradio/abc/{UPLOAD_NAME}") | set(display.dicom_identity.values())
    typed = "Student wrote: this is Doe Jane, MRN-77123, from Doe_Jane_MRN-77123_chest.dcm"
    records = [
        CaseRecord(
            title="Uploaded film 1",
            history=typed,
            student_read=read_from_labels(labels),
            student_notes=typed,
            model_read=model_read(structured_report(labels)),
            key=labels,
            questions=((typed, "An answer that mentions Doe^Jane."),),
        )
    ]
    report = _report(labels)
    exports = {
        "csv": session_csv(records, forbidden).encode(),
        "pdf": subprocess.run(
            ["pdftotext", "-", "-"], input=session_pdf(records, forbidden), capture_output=True, check=True
        ).stdout
        if shutil.which("pdftotext")
        else session_pdf(records, forbidden),
        "sr": sr_bytes(report, display.dicom_identity),
        "markdown": report.markdown().encode(),
        "json": report.to_json().encode(),
    }
    needles = ["Doe^Jane", "Doe Jane", "MRN-77123", UPLOAD_NAME, "Doe_Jane_MRN-77123_chest"]
    needles += [v for k, v in display.dicom_identity.items() if k != "SOPClassUID"]
    for name, data in exports.items():
        lowered = data.lower()
        for needle in needles:
            assert needle.lower().encode() not in lowered, (name, needle)
    assert b"[removed]" in exports["csv"]
