"""The student's marks and the model's boxes as a DICOM Comprehensive 3D SR, TID 1500 (Measurement Report), built by
highdicom: one Planar ROI group (TID 1410) per mark, its region a SCOORD on the film (POINT for a point, a closed
POLYLINE of five vertices for a box) referencing the film's image. A viewer that reads TID 1500 (OHIF) shows them.

SCOORD coordinates are the image's (column, row) with (0, 0) at the top-left corner of the top-left pixel, so a
mark at fractions (y, x) of the film lies at (x * columns, y * rows).

Who marked it: each group's tracking identifier says "student" or "model" and the finding, its Measurement Method
is a local code (STUDENT_METHOD, MODEL_METHOD) and its Finding the finding (FINDING_SCHEME, a local scheme: the
phantoms' findings by name). A model's group names the checkpoint as its algorithm.

Identifiers, as the report's SR (teaching.sr): anonymous by default. The referenced image is the source film's own
only when the film is DICOM with a patient and the operator allows identifiers; otherwise (a PNG or JPEG upload,
a phantom, or identifiers not allowed) it is a stand-in image identity with new UIDs, as teaching.sr makes for its
evidence, and nothing names the patient, the study or the uploaded file.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from medgemma_xray.teaching.marks import Mark, shown_name

COMPREHENSIVE_3D_SR = "1.2.840.10008.5.1.4.1.1.88.34"
LOCAL_SCHEME = "99MGXRAY"  # a private coding scheme (DICOM PS3.16 8.2: local schemes start with 99)
FINDING_SCHEME = LOCAL_SCHEME
STUDENT, MODEL = "student", "model"
STUDENT_METHOD = ("STUDENT-MARK", "Student's mark on the film (teaching round)")
MODEL_METHOD = ("MODEL-BOX", "Model's box (localisation answer)")


@dataclass(frozen=True)
class SrMark:
    """One mark as the SR carries it: who made it, and the mark (film fractions)."""

    who: str  # STUDENT or MODEL
    mark: Mark


def scoord(mark: Mark, rows: int, cols: int) -> tuple[str, list[tuple[float, float]]]:
    """(graphic type, [(column, row), ...]) of a mark on a film of rows x cols."""
    if mark.is_point:
        return "POINT", [(mark.x0 * cols, mark.y0 * rows)]
    x0, x1, y0, y1 = mark.x0 * cols, mark.x1 * cols, mark.y0 * rows, mark.y1 * rows
    return "POLYLINE", [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]


def _code(value: str, scheme: str, meaning: str):
    from highdicom.sr import CodedConcept

    return CodedConcept(value=value, scheme_designator=scheme, meaning=meaning[:64])


def _group(number: int, item: SrMark, rows: int, cols: int, image, model_name: str):
    import numpy as np
    from highdicom import UID
    from highdicom.sr import (
        AlgorithmIdentification,
        ImageRegion,
        PlanarROIMeasurementsAndQualitativeEvaluations,
        SourceImageForRegion,
        TrackingIdentifier,
    )

    graphic_type, points = scoord(item.mark, rows, cols)
    region = ImageRegion(
        graphic_type=graphic_type,
        graphic_data=np.array(points, dtype=float),
        source_image=SourceImageForRegion(
            referenced_sop_class_uid=image.SOPClassUID, referenced_sop_instance_uid=image.SOPInstanceUID
        ),
    )
    method = STUDENT_METHOD if item.who == STUDENT else MODEL_METHOD
    finding = item.mark.finding
    algorithm = AlgorithmIdentification(name=model_name[:64] or "model", version="1") if item.who == MODEL else None
    return PlanarROIMeasurementsAndQualitativeEvaluations(
        tracking_identifier=TrackingIdentifier(
            uid=UID(), identifier=f"{item.who} {number}: {shown_name(finding)}"[:64]
        ),
        referenced_region=region,
        finding_type=_code(finding[:16].upper().replace(" ", "_"), FINDING_SCHEME, shown_name(finding)),
        method=_code(*method[:1], LOCAL_SCHEME, method[1]),
        algorithm_id=algorithm,
    )


def measurement_sr_bytes(
    marks: Sequence[SrMark],
    shape: tuple[int, int],
    identity: dict | None = None,
    include_identifiers: bool = False,
    model_name: str = "",
) -> bytes:
    """A Comprehensive 3D SR Part 10 file holding every mark (TID 1500). shape: the film's (rows, columns).
    identity: the source film's DICOM attributes (viewer.DisplayFilm.dicom_identity), used only when allowed."""
    from highdicom.sr import (
        Comprehensive3DSR,
        DeviceObserverIdentifyingAttributes,
        MeasurementReport,
        ObservationContext,
        ObserverContext,
    )
    from pydicom.sr.codedict import codes
    from pydicom.uid import generate_uid

    from medgemma_xray.teaching.sr import MANUFACTURER, _evidence

    if not marks:
        raise ValueError("No marks to export: mark a finding on the film (or ask the model Where?) first.")
    rows, cols = shape
    image, _ = _evidence(identity or {}, include_identifiers)
    observer = ObserverContext(
        observer_type=codes.cid270.Device,
        observer_identifying_attributes=DeviceObserverIdentifyingAttributes(
            uid=generate_uid(), name="MedGemma X-Ray assistant teaching page"
        ),
    )
    report = MeasurementReport(
        observation_context=ObservationContext(observer_device_context=observer),
        procedure_reported=_code("399208008", "SCT", "Plain chest X-ray"),
        imaging_measurements=[
            _group(number, item, rows, cols, image, model_name) for number, item in enumerate(marks, start=1)
        ],
    )
    document = Comprehensive3DSR(
        evidence=[image],
        content=report,
        series_instance_uid=generate_uid(),
        series_number=1,
        sop_instance_uid=generate_uid(),
        instance_number=1,
        manufacturer=MANUFACTURER,
        is_complete=True,
        series_description="Teaching-round marks (not for diagnosis)",
    )
    buffer = io.BytesIO()
    document.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def read_marks(data: bytes) -> list[tuple[str, str, str, list[tuple[float, float]]]]:
    """(who, finding, graphic type, [(column, row), ...]) of every mark in an SR written by measurement_sr_bytes,
    read back through highdicom (the tests' round trip; a teacher's script can use it too)."""
    import highdicom as hd
    from pydicom import dcmread

    document = hd.sr.Comprehensive3DSR.from_dataset(dcmread(io.BytesIO(data)))
    report: Any = document.content  # a MeasurementReport: highdicom types it as its ContentSequence base
    found = []
    for group in report.get_planar_roi_measurement_groups():
        who = STUDENT if group.method is not None and group.method.value == STUDENT_METHOD[0] else MODEL
        region = group.roi
        graphic = region.GraphicType if region is not None else ""
        points = [(float(p[0]), float(p[1])) for p in region.value] if region is not None else []
        finding = str(group.finding_type.meaning) if group.finding_type else ""
        found.append((who, finding, str(graphic), points))
    return found
