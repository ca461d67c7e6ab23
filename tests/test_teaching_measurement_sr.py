"""The marks' DICOM SR (teaching.measurement_sr): a Comprehensive 3D SR with TID 1500 written by highdicom, read
back by highdicom with the coordinates written, referencing the film's image, anonymous unless allowed, and valid
by dciodvfy (Debian's dicom3tools; scripts/setup_env.sh --dev installs it)."""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest

from medgemma_xray.teaching.marks import Mark
from medgemma_xray.teaching.measurement_sr import (
    COMPREHENSIVE_3D_SR,
    MODEL,
    STUDENT,
    SrMark,
    measurement_sr_bytes,
    read_marks,
    scoord,
)

SHAPE = (512, 400)
MARKS = [
    SrMark(STUDENT, Mark.box("pleural_effusion", (0.6, 0.1), (0.8, 0.4))),
    SrMark(STUDENT, Mark.point("pacemaker", 0.2, 0.8)),
    SrMark(MODEL, Mark.box("pleural_effusion", (0.55, 0.12), (0.78, 0.38))),
]
SOURCE = {
    "PatientName": "Synthetic^Phantom",
    "PatientID": "SYN0001",
    "StudyInstanceUID": "1.2.826.0.1.3680043.8.498.1",
    "SeriesInstanceUID": "1.2.826.0.1.3680043.8.498.2",
    "SOPInstanceUID": "1.2.826.0.1.3680043.8.498.3",
    "SOPClassUID": "1.2.840.10008.5.1.4.1.1.1.1",
}


def test_the_sr_reads_back_with_the_coordinates_written():
    data = measurement_sr_bytes(MARKS, SHAPE, model_name="demo checkpoint")
    read = read_marks(data)
    assert [(who, finding, graphic) for who, finding, graphic, _ in read] == [
        ("student", "pleural effusion", "POLYLINE"),
        ("student", "pacemaker", "POINT"),
        ("model", "pleural effusion", "POLYLINE"),
    ]
    for item, (_, _, _, points) in zip(MARKS, read, strict=True):
        _, written = scoord(item.mark, *SHAPE)
        assert np.array_equal(np.float32(points), np.float32(written))  # SCOORD data are 32-bit floats
    # The box's corners in the image's (column, row): x0 = 0.1 * 400, y0 = 0.6 * 512.
    assert read[0][3][0] == (40.0, float(np.float32(0.6 * 512)))


def test_the_sr_is_tid_1500_referencing_one_image_and_names_no_one():
    import highdicom as hd
    from pydicom import dcmread

    dataset = dcmread(io.BytesIO(measurement_sr_bytes(MARKS, SHAPE, SOURCE, include_identifiers=False)))
    assert dataset.SOPClassUID == COMPREHENSIVE_3D_SR
    assert dataset.ContentTemplateSequence[0].TemplateIdentifier == "1500"
    assert str(dataset.PatientName) == "" and dataset.PatientID == ""
    assert dataset.StudyInstanceUID != SOURCE["StudyInstanceUID"]
    document = hd.sr.srread(io.BytesIO(dataset_bytes(dataset)))
    groups = document.content.get_planar_roi_measurement_groups()
    images = {group.roi.ContentSequence[0].ReferencedSOPSequence[0].ReferencedSOPInstanceUID for group in groups}
    assert len(images) == 1 and SOURCE["SOPInstanceUID"] not in images
    evidence = dataset.CurrentRequestedProcedureEvidenceSequence[0].ReferencedSeriesSequence[0]
    assert evidence.ReferencedSOPSequence[0].ReferencedSOPInstanceUID in images
    text = dataset_bytes(dataset)
    for identifier in (b"Synthetic", b"SYN0001"):
        assert identifier not in text


def test_the_source_film_is_referenced_only_when_allowed():
    import highdicom as hd

    document = hd.sr.srread(io.BytesIO(measurement_sr_bytes(MARKS, SHAPE, SOURCE, include_identifiers=True)))
    group = document.content.get_planar_roi_measurement_groups()[0]
    assert group.roi.ContentSequence[0].ReferencedSOPSequence[0].ReferencedSOPInstanceUID == SOURCE["SOPInstanceUID"]
    assert str(document.PatientName) == "Synthetic^Phantom"


def test_no_marks_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="mark a finding"):
        measurement_sr_bytes([], SHAPE)


def dataset_bytes(dataset) -> bytes:
    buffer = io.BytesIO()
    dataset.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def test_dciodvfy_finds_no_error(tmp_path):
    if not shutil.which("dciodvfy"):
        pytest.skip("dciodvfy is not installed: scripts/setup_env.sh --dev installs Debian's dicom3tools")
    path = tmp_path / "marks-sr.dcm"
    path.write_bytes(measurement_sr_bytes(MARKS, SHAPE, model_name="demo checkpoint"))
    result = subprocess.run(["dciodvfy", str(path)], capture_output=True, text=True, check=False)
    report = result.stdout + result.stderr
    assert "Comprehensive3DSR" in report, report
    errors = [line for line in report.splitlines() if line.startswith("Error")]
    assert not errors, report
