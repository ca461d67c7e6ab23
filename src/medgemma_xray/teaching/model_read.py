"""The model's read, taken from its structured report text, in the scoring schema (medgemma_xray.teaching.scoring.READ_FIELDS).

The report is parsed into its fields by medgemma_xray.assistant.report.parse_report (the format the demo model was trained on,
and whatever a real model writes instead); each field's text is then read for the findings and attributes the
key scores. A region the report does not fill leaves its fields "not stated"; a filled region that names no
finding reads as "absent".
"""

from __future__ import annotations

import re

from medgemma_xray.assistant.report import parse_report
from medgemma_xray.phantoms.findings import CENTRAL_LINE_ROUTES, CENTRAL_LINE_TIPS
from medgemma_xray.teaching.keys import ALL_LOBES

_LOBE = "|".join(re.escape(lobe) for lobe in ALL_LOBES)
_NUMBER = r"(\d+(?:\.\d+)?)"
_EFFUSION = re.compile(r"\b(small|moderate|large)\s+(right|left|bilateral)\s+pleural\s+effusion", re.I)
_EFFUSION_SIDE_FIRST = re.compile(r"\b(right|left|bilateral)[\s-]+(?:sided\s+)?pleural\s+effusion", re.I)
_PNEUMOTHORAX = re.compile(r"\b(?:(small|large)\s+)?(right|left)(?:[\s-]+sided)?\s+pneumothorax", re.I)
_NODULE = re.compile(rf"{_NUMBER}\s*cm\s+(?:\w+\s+)?(nodule|mass)\b(?:[^.]*?\b({_LOBE}))?", re.I)
_NODULE_LOBE_ONLY = re.compile(rf"\b(nodule|mass)\b[^.]*?\b({_LOBE})", re.I)
_CONSOLIDATION = re.compile(rf"consolidation[^.]*?\b({_LOBE})", re.I)
_CTR = re.compile(r"cardiothoracic\s+ratio[^0-9.]{0,20}(0?\.\d+)", re.I)
_TUBE = re.compile(rf"endotracheal\s+tube[^.]*?{_NUMBER}\s*cm\s+above\s+the\s+carina", re.I)
_ROUTE = re.compile("|".join(re.escape(route) for route in CENTRAL_LINE_ROUTES), re.I)
_TIP = re.compile(rf"tip[^.]*?\b({'|'.join(re.escape(tip) for tip in CENTRAL_LINE_TIPS)})", re.I)
_PACEMAKER = re.compile(r"\b(left|right)[\s-]+sided\s+pacemaker|pacemaker[^.]*?\b(left|right)\b", re.I)
_NEGATED = re.compile(r"\bno\b[^.]*$", re.I)  # "No pleural effusion or pneumothorax": a negation earlier in a sentence


def _mentioned(text: str, word: str) -> bool | None:
    """True where `word` is stated positively in some sentence, False where only negated; None when absent."""
    seen = None
    for sentence in re.split(r"(?<=[.;])\s+", text):
        lowered = sentence.lower()
        position = lowered.find(word)
        if position < 0:
            continue
        if _NEGATED.search(lowered[:position]):
            seen = False if seen is None else seen
        else:
            return True
    return seen


def model_read(report_text: str) -> dict[str, object]:
    """The read stated by a structured report's text (medgemma_xray.teaching.scoring.READ_FIELDS; absent = not stated)."""
    fields = parse_report(report_text).fields
    read: dict[str, object] = {}
    _read_technique(fields.get("technique", ""), read)
    _read_lungs(fields.get("lungs", ""), read)
    _read_pleura(fields.get("pleura", ""), read)
    _read_heart(fields.get("heart_mediastinum", ""), read)
    _read_devices(fields.get("lines_devices", ""), read)
    return read


def _read_technique(text: str, read: dict) -> None:
    if not text:
        return
    lowered = text.lower()
    if "not rotated" in lowered:
        read["technique.rotated"] = False
    elif "rotated" in lowered or "rotation" in lowered:
        read["technique.rotated"] = True
    if "poor inspiration" in lowered:
        read["technique.inspiration"] = "poor"
    elif "adequate inspiration" in lowered or "good inspiration" in lowered:
        read["technique.inspiration"] = "adequate"
    if "underexposed" in lowered or "under-exposed" in lowered:
        read["technique.exposure"] = "under"
    elif "overexposed" in lowered or "over-exposed" in lowered:
        read["technique.exposure"] = "over"
    elif "adequate exposure" in lowered or "adequately exposed" in lowered:
        read["technique.exposure"] = "adequate"


def _read_lungs(text: str, read: dict) -> None:
    if not text:
        return
    nodule = _NODULE.search(text)
    if nodule:
        read["present.nodule_or_mass"] = True
        read["nodule.size_cm"] = float(nodule.group(1))
        if nodule.group(3):
            read["nodule.lobe"] = nodule.group(3).lower()
    elif lobe_only := _NODULE_LOBE_ONLY.search(text):
        read["present.nodule_or_mass"] = _mentioned(text, lobe_only.group(1).lower()) is not False
        read["nodule.lobe"] = lobe_only.group(2).lower()
    else:
        stated = _mentioned(text, "nodule") or _mentioned(text, "mass")
        read["present.nodule_or_mass"] = bool(stated)
    consolidation = _CONSOLIDATION.search(text)
    if consolidation and _mentioned(text, "consolidation"):
        read["present.consolidation"] = True
        read["consolidation.lobe"] = consolidation.group(1).lower()
    else:
        read["present.consolidation"] = bool(_mentioned(text, "consolidation"))


def _read_pleura(text: str, read: dict) -> None:
    if not text:
        return
    effusion = _EFFUSION.search(text)
    side_first = _EFFUSION_SIDE_FIRST.search(text)
    if effusion or (side_first and _mentioned(text, "effusion")):
        read["present.pleural_effusion"] = True
        if effusion:
            read["effusion.size"] = effusion.group(1).lower()
            side = effusion.group(2).lower()
        elif side_first is not None:  # always so here: see the condition above
            side = side_first.group(1).lower()
        read["effusion.side"] = "both" if side == "bilateral" else side
    else:
        read["present.pleural_effusion"] = bool(_mentioned(text, "effusion"))
    pneumothorax = _PNEUMOTHORAX.search(text)
    if pneumothorax and _mentioned(text, "pneumothorax"):
        read["present.pneumothorax"] = True
        read["pneumothorax.side"] = pneumothorax.group(2).lower()
        if pneumothorax.group(1):
            read["pneumothorax.size"] = pneumothorax.group(1).lower()
    else:
        read["present.pneumothorax"] = bool(_mentioned(text, "pneumothorax"))


def _read_heart(text: str, read: dict) -> None:
    if not text:
        return
    ratio = _CTR.search(text)
    if ratio:
        read["cardiothoracic_ratio"] = float(ratio.group(1))
    lowered = text.lower()
    if "enlarged" in lowered or "cardiomegaly" in lowered:
        read["present.cardiomegaly"] = not bool(re.search(r"\bnot\s+enlarged|\bno\s+cardiomegaly", lowered))
    elif "normal heart size" in lowered or "heart size is normal" in lowered or "normal size" in lowered:
        read["present.cardiomegaly"] = False
    elif ratio:
        read["present.cardiomegaly"] = float(ratio.group(1)) > 0.5


def _read_devices(text: str, read: dict) -> None:
    if not text:
        return
    tube = _TUBE.search(text)
    read["present.endotracheal_tube"] = bool(_mentioned(text, "endotracheal tube") or _mentioned(text, "et tube"))
    if tube:
        read["present.endotracheal_tube"] = True
        read["endotracheal_tube.tip_above_carina_cm"] = float(tube.group(1))
    line_stated = _mentioned(text, "central venous line") or _mentioned(text, "central line")
    read["present.central_line"] = bool(line_stated)
    if line_stated:
        sentence = next(s for s in re.split(r"(?<=\.)\s+", text) if "line" in s.lower())
        if route := _ROUTE.search(sentence):
            read["central_line.route"] = route.group(0).lower()
        if tip := _TIP.search(sentence):
            read["central_line.tip"] = tip.group(1).lower()
    pacemaker = _PACEMAKER.search(text)
    read["present.pacemaker"] = bool(_mentioned(text, "pacemaker"))
    if pacemaker and read["present.pacemaker"]:
        read["pacemaker.side"] = (pacemaker.group(1) or pacemaker.group(2)).lower()
