"""The report as a DICOM Basic Text SR (highdicom builds and checks the content tree; pydicom writes the file).

highdicom offers Enhanced, Comprehensive and Comprehensive 3D SR classes; a Basic Text SR is the same IOD with
only CONTAINER and TEXT items under CONTAINS, so this module uses highdicom's common SR base with the Basic Text
SR SOP class (highdicom, pinned in constraints.txt). The tree follows TID 2000 (Basic Diagnostic Imaging
Report): History (indication), Prior Procedure Descriptions (comparison), Findings, Impressions, Recommendations.

Identifiers: by default the SR is anonymous. It names no patient and no accession, and its study, series and
instance UIDs are new, so it cannot be linked to the source film. The source film's patient and study are carried
over only when the film had them and the operator allows it (include_identifiers=True, from the server's
SR_INCLUDE_IDENTIFIERS setting).
"""

from __future__ import annotations

import io

from medgemma_xray.teaching.report_context import TeachingReport

BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"
MANUFACTURER = "MedGemma X-Ray assistant (education and research only)"
_FINDING_LABELS = ("View", "Technique", "Lungs", "Pleura", "Heart and mediastinum", "Bones", "Lines and devices")
_IDENTITY = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "AccessionNumber",
    "StudyID",
    "StudyDate",
    "StudyTime",
    "ReferringPhysicianName",
)


def _code(value: str, scheme: str, meaning: str):
    from highdicom.sr import CodedConcept

    return CodedConcept(value=value, scheme_designator=scheme, meaning=meaning)


def _content(report: TeachingReport):
    from highdicom.sr import ContainerContentItem, ContentSequence, RelationshipTypeValues, TextContentItem

    contains = RelationshipTypeValues.CONTAINS
    sections = dict(report.sections())

    def text(code, value: str):
        return TextContentItem(name=code, value=value[:1024] or "-", relationship_type=contains)

    def section(code, items):
        item = ContainerContentItem(name=code, relationship_type=contains)
        item.ContentSequence = ContentSequence(items)
        return item

    finding = _code("121071", "DCM", "Finding")
    children = [
        section(
            _code("121060", "DCM", "History"),
            [text(_code("121109", "DCM", "Indications for Procedure"), sections["Indication"])],
        ),
        section(
            _code("121066", "DCM", "Prior Procedure Descriptions"),
            [text(_code("121065", "DCM", "Procedure Description"), sections["Comparison"])],
        ),
        section(
            _code("121070", "DCM", "Findings"),
            [text(finding, f"{label}: {sections[label]}") for label in _FINDING_LABELS],
        ),
        section(
            _code("121072", "DCM", "Impressions"), [text(_code("121073", "DCM", "Impression"), sections["Impression"])]
        ),
        section(
            _code("121074", "DCM", "Recommendations"),
            [text(_code("121075", "DCM", "Recommendation"), sections["Recommendation"])],
        ),
    ]
    root = ContainerContentItem(name=_code("18748-4", "LN", "Diagnostic Imaging Report"), template_id="2000")
    root.ContentSequence = ContentSequence(children)
    return root


def _evidence(identity: dict, include_identifiers: bool):
    """The dataset highdicom takes patient and study from: the source's, or an anonymous stand-in."""
    from pydicom.dataset import Dataset
    from pydicom.uid import generate_uid

    evidence = Dataset()
    use_source = include_identifiers and bool(identity.get("PatientName") or identity.get("PatientID"))
    for keyword in _IDENTITY:
        setattr(evidence, keyword, identity.get(keyword, "") if use_source else "")
    evidence.StudyInstanceUID = (
        identity.get("StudyInstanceUID") if use_source and identity.get("StudyInstanceUID") else generate_uid()
    )
    evidence.SeriesInstanceUID = (
        identity.get("SeriesInstanceUID") if use_source and identity.get("SeriesInstanceUID") else generate_uid()
    )
    evidence.SOPInstanceUID = (
        identity.get("SOPInstanceUID") if use_source and identity.get("SOPInstanceUID") else generate_uid()
    )
    evidence.SOPClassUID = identity.get("SOPClassUID") or "1.2.840.10008.5.1.4.1.1.7"  # Secondary Capture
    evidence.Modality = "DX"
    return evidence, use_source


def sr_bytes(report: TeachingReport, identity: dict | None = None, include_identifiers: bool = False) -> bytes:
    """A Basic Text SR Part 10 file of the report. identity: the source film's attributes (viewer.DisplayFilm's
    dicom_identity); used only with include_identifiers, and only when it names a patient."""
    from highdicom.sr.sop import _SR
    from pydicom.uid import generate_uid

    evidence, use_source = _evidence(identity or {}, include_identifiers)
    document = _SR(
        evidence=[evidence],
        content=_content(report),
        series_instance_uid=generate_uid(),
        series_number=1,
        sop_instance_uid=generate_uid(),
        sop_class_uid=BASIC_TEXT_SR,
        instance_number=1,
        manufacturer=MANUFACTURER,
        is_complete=True,
        record_evidence=use_source,
    )
    if not use_source:
        # The stand-in's UIDs name no real image: an anonymous SR references no evidence at all.
        for keyword in ("CurrentRequestedProcedureEvidenceSequence", "PertinentOtherEvidenceSequence"):
            if keyword in document:
                delattr(document, keyword)
    document.SeriesDescription = "Teaching-round report (not for diagnosis)"
    buffer = io.BytesIO()
    document.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()
