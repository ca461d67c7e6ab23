"""The conventional report fields the model is not asked for: indication, comparison and recommendation.

The demo model was trained on the report text of medgemma_xray.assistant.report_schema (one line per REPORT_FIELDS entry), so
the prompt and the model's output stay as they are and keep parsing. These three fields come from the case (its
history and comparison) and from the teacher, and are set around the model's fields: indication and comparison
before the findings, recommendation after the impression.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from medgemma_xray.assistant.report import StructuredReport
from medgemma_xray.assistant.report_export import DISCLAIMER
from medgemma_xray.assistant.report_schema import REPORT_FIELDS

NOT_GIVEN = "Not given."


@dataclass(frozen=True)
class ClinicalContext:
    indication: str = ""
    comparison: str = ""
    recommendation: str = ""

    def cleaned(self) -> ClinicalContext:
        return ClinicalContext(
            *(" ".join((text or "").split()) for text in (self.indication, self.comparison, self.recommendation))
        )


@dataclass(frozen=True)
class TeachingReport:
    """The model's structured report with the clinical context around it, in reading order."""

    context: ClinicalContext
    report: StructuredReport
    byline: str = ""  # the day and, if given, the student's name: printed under the title, not in the SR

    def sections(self) -> list[tuple[str, str]]:
        """(label, text) in the order a report is read: indication, comparison, the model's fields, recommendation."""
        context = self.context.cleaned()
        rows = [("Indication", context.indication or NOT_GIVEN), ("Comparison", context.comparison or NOT_GIVEN)]
        rows += [(spec.label, self.report.fields.get(spec.key) or "(not stated)") for spec in REPORT_FIELDS]
        rows.append(("Recommendation", context.recommendation or NOT_GIVEN))
        return rows

    def markdown(self) -> str:
        lines = ["# Chest X-ray report (teaching round)", ""]
        if self.byline:
            lines += [f"_{self.byline}_", ""]
        lines += [f"> {DISCLAIMER}", ""]
        lines += [f"**{label}:** {text}  " for label, text in self.sections()]
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        context = self.context.cleaned()
        document = {
            "format": "medgemma-xray-teaching-report/1",
            "disclaimer": DISCLAIMER,
            "indication": context.indication,
            "comparison": context.comparison,
            "fields": dict(self.report.fields),
            "recommendation": context.recommendation,
            "raw_text": self.report.raw_text,
        }
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
