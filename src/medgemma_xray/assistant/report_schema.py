"""The structured report's fixed schema: its fields, the line format the model writes, and the prompt that asks for it.

One line per field, "Label: text", in this order. The demo model is trained on exactly this format and prompt;
the real MedGemma is asked for it, and the report parser tolerates whatever it writes instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReportField:
    key: str  # JSON key
    label: str  # the line's label in the model's text
    region: str | None  # findings region, None for view/technique/impression


REPORT_FIELDS: tuple[ReportField, ...] = (
    ReportField("view", "View", None),
    ReportField("technique", "Technique", None),
    ReportField("lungs", "Lungs", "lungs"),
    ReportField("pleura", "Pleura", "pleura"),
    ReportField("heart_mediastinum", "Heart and mediastinum", "heart and mediastinum"),
    ReportField("bones", "Bones", "bones"),
    ReportField("lines_devices", "Lines and devices", "lines, tubes and devices"),
    ReportField("impression", "Impression", None),
)

REPORT_PROMPT = (
    "Write a structured report for this chest X-ray, one line per field: "
    + ", ".join(field.label for field in REPORT_FIELDS)
    + "."
)
