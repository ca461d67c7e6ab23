"""The canonical yes/no question for each finding (and its paraphrases): task accuracy asks
FINDING_QUESTIONS[f][0]; the demo model was trained on all of them."""

from __future__ import annotations

FINDING_QUESTIONS: dict[str, tuple[str, ...]] = {
    "pleural_effusion": (
        "Is there a pleural effusion?",
        "Any pleural effusion?",
        "Are the costophrenic angles blunted?",
        "Do you see fluid in the pleural space?",
    ),
    "cardiomegaly": (
        "Is the heart enlarged?",
        "Is there cardiomegaly?",
        "Is the cardiac silhouette enlarged?",
        "Is the heart big?",
    ),
    "pneumothorax": (
        "Is there a pneumothorax?",
        "Any pneumothorax?",
        "Is there a visible pleural line?",
        "Is the lung collapsed?",
    ),
    "nodule_or_mass": (
        "Is there a lung nodule or mass?",
        "Any nodule?",
        "Is there a mass?",
        "Do you see a focal round opacity?",
    ),
    "consolidation": (
        "Is there consolidation?",
        "Any consolidation?",
        "Is there pneumonia?",
        "Is there an airspace opacity?",
    ),
    "endotracheal_tube": (
        "Is there an endotracheal tube?",
        "Is the patient intubated?",
        "Where is the ET tube?",
        "Is there a breathing tube?",
    ),
    "central_line": (
        "Is there a central venous line?",
        "Is there a central line?",
        "Where is the central line tip?",
        "Is there a venous catheter?",
    ),
    "pacemaker": (
        "Is there a pacemaker?",
        "Any cardiac device?",
        "Is there a pacing device?",
        "Is there a pacemaker generator?",
    ),
}
