"""Teaching-round questions and answers, and structured reports, written from a phantom's labels.

The demo model learns exactly these texts. The report is one "Label: text" line per REPORT_FIELDS entry, in
order, answering REPORT_PROMPT. FINDING_QUESTIONS[f][0] is the canonical question that task accuracy asks.
"""

from __future__ import annotations

import numpy as np

from medgemma_xray.assistant.report_schema import REPORT_FIELDS, REPORT_PROMPT
from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels
from medgemma_xray.phantoms.questions import FINDING_QUESTIONS

TECHNIQUE_QUESTIONS = (
    "Is this film technically adequate (rotation, inspiration, penetration)?",
    "Comment on the technique.",
    "Is the film rotated?",
    "Is the inspiration adequate?",
)
# The UI's example questions and the report's section prompts (medgemma_xray.assistant.case), so the demo answers them too.
MAIN_FINDINGS_QUESTIONS = (
    "What are the main findings on this chest X-ray?",
    "What are the main findings?",
    "Describe the findings.",
    "What do you see?",
)
PLEURA_QUESTIONS = ("Is there a pneumothorax or pleural effusion?", "Describe the pleura.")
HEART_QUESTIONS = ("Describe the heart size and the mediastinum.", "Describe the heart.")
DEVICE_QUESTIONS = (
    "Are there any lines, tubes or devices? Where do they terminate?",
    "Any lines or tubes?",
    "List the lines and devices.",
)
DIFFERENTIAL_QUESTIONS = (
    "What is the differential diagnosis for the most prominent abnormality?",
    "What is the differential diagnosis?",
)
FINDINGS_SECTION_PROMPT = (
    "Describe the findings on this chest X-ray systematically: lungs, pleura, heart, mediastinum, "
    "bones and devices. Be concise."
)
IMPRESSION_SECTION_PROMPT = "Give the impression for this chest X-ray in one or two sentences."

_DIFFERENTIALS = {
    "pneumothorax": "spontaneous pneumothorax, pneumothorax after a procedure, or from underlying lung disease",
    "mass": "primary lung cancer, metastasis, or lymphoma",
    "consolidation": "pneumonia, aspiration, or pulmonary haemorrhage",
    "pleural_effusion": "heart failure, a parapneumonic effusion, or malignancy",
    "nodule": "a granuloma, a primary lung cancer, or a metastasis",
    "cardiomegaly": "cardiomyopathy, valve disease, or a pericardial effusion",
}
_LINE_TIP = {
    "superior vena cava": "in the superior vena cava",
    "cavoatrial junction": "at the cavoatrial junction",
    "right atrium": "in the right atrium",
}


def _ratio(labels: PhantomLabels) -> str:
    return f"{round(labels.heart.cardiothoracic_ratio * 20) / 20:.2f}"  # to the nearest 0.05, as read by eye


def effusion_phrase(labels: PhantomLabels) -> str | None:
    effusion = labels.effusion
    if effusion is None:
        return None
    if effusion.side == "both":
        return f"{effusion.size} bilateral pleural effusions"
    detail = {"small": " blunting the costophrenic angle", "moderate": " with a meniscus", "large": ""}[effusion.size]
    return f"a {effusion.size} {effusion.side} pleural effusion{detail}"


def pneumothorax_phrase(labels: PhantomLabels) -> str | None:
    if labels.pneumothorax is None:
        return None
    return f"a {labels.pneumothorax.size} {labels.pneumothorax.side} pneumothorax with a visible pleural line"


def nodule_phrase(labels: PhantomLabels) -> str | None:
    if labels.nodule is None:
        return None
    return f"a {labels.nodule.size_cm:.0f} cm {labels.nodule.kind} in the {labels.nodule.lobe}"


def consolidation_phrase(labels: PhantomLabels) -> str | None:
    return None if labels.consolidation is None else f"consolidation in the {labels.consolidation.lobe}"


def tube_phrase(labels: PhantomLabels) -> str | None:
    tube = labels.endotracheal_tube
    return None if tube is None else f"an endotracheal tube, tip {tube.tip_above_carina_cm:.0f} cm above the carina"


def central_line_phrase(labels: PhantomLabels) -> str | None:
    line = labels.central_line
    return None if line is None else f"a {line.route} central venous line, tip {_LINE_TIP[line.tip]}"


def pacemaker_phrase(labels: PhantomLabels) -> str | None:
    if labels.pacemaker is None:
        return None
    return f"a {labels.pacemaker.side}-sided pacemaker with its lead in the right ventricle"


def device_phrases(labels: PhantomLabels) -> list[str]:
    return [p for p in (tube_phrase(labels), central_line_phrase(labels), pacemaker_phrase(labels)) if p]


def _sentence(phrase: str) -> str:
    return phrase[0].upper() + phrase[1:] + "."


def _join(phrases: list[str]) -> str:
    return " ".join(_sentence(p) for p in phrases)


def finding_answer(finding: str, labels: PhantomLabels) -> str:
    """The answer to any of FINDING_QUESTIONS[finding]: it starts with "Yes" or "No"."""
    if finding == "cardiomegaly":
        if labels.heart.enlarged:
            return f"Yes, the heart is enlarged: cardiothoracic ratio about {_ratio(labels)}."
        return f"No, the heart size is normal: cardiothoracic ratio about {_ratio(labels)}."
    positive = {
        "pleural_effusion": effusion_phrase,
        "pneumothorax": pneumothorax_phrase,
        "nodule_or_mass": nodule_phrase,
        "consolidation": consolidation_phrase,
        "endotracheal_tube": tube_phrase,
        "central_line": central_line_phrase,
        "pacemaker": pacemaker_phrase,
    }
    phrase = positive[finding](labels)
    if phrase is not None:
        return f"Yes, {phrase}."
    negative = {
        "pleural_effusion": "No pleural effusion.",
        "pneumothorax": "No pneumothorax.",
        "nodule_or_mass": "No lung nodule or mass.",
        "consolidation": "No consolidation.",
        "endotracheal_tube": "No endotracheal tube.",
        "central_line": "No central venous line.",
        "pacemaker": "No pacemaker.",
    }
    return negative[finding]


def technique_text(labels: PhantomLabels) -> str:
    technique = labels.technique
    exposure = {"adequate": "adequate exposure", "under": "underexposed", "over": "overexposed"}[technique.exposure]
    rotation = "Rotated" if technique.rotated else "Not rotated"
    return f"{rotation}, {technique.inspiration} inspiration, {exposure}."


def technique_answer(question: str, labels: PhantomLabels) -> str:
    technique = labels.technique
    if question == "Is the film rotated?":
        return "Yes, the film is rotated." if technique.rotated else "No, the film is not rotated."
    if question == "Is the inspiration adequate?":
        return "Yes, adequate inspiration." if technique.inspiration == "adequate" else "No, poor inspiration."
    text = technique_text(labels)
    return ("Adequate: " if technique.adequate else "Not ideal: ") + text[0].lower() + text[1:]


def lungs_text(labels: PhantomLabels) -> str:
    phrases = [p for p in (consolidation_phrase(labels), nodule_phrase(labels)) if p]
    return _join(phrases) if phrases else "Clear lungs."


def pleura_text(labels: PhantomLabels) -> str:
    phrases = [p for p in (effusion_phrase(labels), pneumothorax_phrase(labels)) if p]
    return _join(phrases) if phrases else "No pleural effusion or pneumothorax."


def heart_text(labels: PhantomLabels) -> str:
    size = "Enlarged heart" if labels.heart.enlarged else "Normal heart size"
    return f"{size}, cardiothoracic ratio about {_ratio(labels)}. Normal mediastinum."


def devices_text(labels: PhantomLabels) -> str:
    phrases = device_phrases(labels)
    return _join(phrases) if phrases else "None."


def impression_text(labels: PhantomLabels) -> str:
    phrases = [
        p
        for p in (
            pneumothorax_phrase(labels),
            effusion_phrase(labels),
            consolidation_phrase(labels),
            nodule_phrase(labels),
        )
        if p
    ]
    if labels.heart.enlarged:
        phrases.append("cardiomegaly")
    if not phrases:
        return "No acute cardiopulmonary abnormality."
    return _sentence("; ".join(phrases))


def structured_report(labels: PhantomLabels) -> str:
    """The answer to REPORT_PROMPT: exactly one "Label: text" line per REPORT_FIELDS entry, in order."""
    texts = {
        "view": "PA.",
        "technique": technique_text(labels),
        "lungs": lungs_text(labels),
        "pleura": pleura_text(labels),
        "heart_mediastinum": heart_text(labels),
        "bones": "No acute bone abnormality.",
        "lines_devices": devices_text(labels),
        "impression": impression_text(labels),
    }
    return "\n".join(f"{field.label}: {texts[field.key]}" for field in REPORT_FIELDS)


def main_findings_text(labels: PhantomLabels) -> str:
    impression = impression_text(labels)
    devices = device_phrases(labels)
    if labels.pathology_free and not labels.heart.enlarged and not devices:
        return "No abnormality: clear lungs, normal heart size, no effusion or pneumothorax, no lines or devices."
    return impression + (" " + _join(devices) if devices else "")


def differential_text(labels: PhantomLabels) -> str:
    """The most prominent abnormality first (pneumothorax, mass, consolidation, effusion, nodule, cardiomegaly)."""
    candidates = [
        ("pneumothorax", labels.pneumothorax is not None),
        ("mass", labels.nodule is not None and labels.nodule.kind == "mass"),
        ("consolidation", labels.consolidation is not None),
        ("pleural_effusion", labels.effusion is not None),
        ("nodule", labels.nodule is not None and labels.nodule.kind == "nodule"),
        ("cardiomegaly", labels.heart.enlarged),
    ]
    for name, present in candidates:
        if present:
            shown = name.replace("_", " ")
            return f"The most prominent abnormality is the {shown}. Differential: {_DIFFERENTIALS[name]}."
    return "There is no abnormality to explain: no differential diagnosis is needed."


def findings_section_text(labels: PhantomLabels) -> str:
    return " ".join(
        [
            lungs_text(labels),
            pleura_text(labels),
            heart_text(labels),
            "No acute bone abnormality.",
            "Devices: " + devices_text(labels),
        ]
    )


def question_answer_pairs(labels: PhantomLabels, rng: np.random.Generator) -> list[tuple[str, str]]:
    """One question (a random phrasing) per topic, each with its answer, in random order."""
    pairs = []
    for finding in FINDINGS:
        pairs.append((str(rng.choice(FINDING_QUESTIONS[finding])), finding_answer(finding, labels)))
    technique_question = str(rng.choice(TECHNIQUE_QUESTIONS))
    pairs.append((technique_question, technique_answer(technique_question, labels)))
    order = rng.permutation(len(pairs))
    return [pairs[i] for i in order]


def overview_pairs(labels: PhantomLabels, rng: np.random.Generator) -> list[tuple[str, str]]:
    """Whole-film questions: the report, the UI's examples, the report section prompts."""
    return [
        (REPORT_PROMPT, structured_report(labels)),
        (str(rng.choice(MAIN_FINDINGS_QUESTIONS)), main_findings_text(labels)),
        (str(rng.choice(PLEURA_QUESTIONS)), pleura_text(labels)),
        (str(rng.choice(HEART_QUESTIONS)), heart_text(labels)),
        (str(rng.choice(DEVICE_QUESTIONS)), devices_text(labels).replace("None.", "No lines, tubes or devices.")),
        (str(rng.choice(DIFFERENTIAL_QUESTIONS)), differential_text(labels)),
        (FINDINGS_SECTION_PROMPT, findings_section_text(labels)),
        (IMPRESSION_SECTION_PROMPT, impression_text(labels)),
    ]
