"""Whether a question is one the film on screen can answer, so that a confidence figure means something.

The confidence of an answer (assistant.confidence) is how sure the model was of its own words. A model trained on
chest films writes fluent film text whatever it is asked, so an answer to "What is the capital of France?" or "How
old is the patient?" comes out at 88-100 %, and a screen that prints it presents a guess as certainty. Such
answers show no percentage; the details line says why instead.

Two rules, on the question's words alone (cheap, the same at every door, and checkable):
- not about the film: it names nothing a chest film shows or a reader of one does (no anatomy, finding, device,
  technique or reading word);
- not answerable from the film: it asks for what no film records (the patient's age, name, symptoms, laboratory
  values, treatment, prognosis, or a comparison with a prior film that is not loaded).
benchmarks/confidence_off_topic.py measures what this changes on a set of on- and off-topic questions.
"""

from __future__ import annotations

import re

NOT_ABOUT_THE_FILM = "the question is not about the film on screen"
NOT_FROM_THE_FILM = "the film alone cannot answer this ({topic})"

# The words a question about a chest film uses: stems (matched at the start of a word, any case), and whole words
# where a stem would match everyday words ("pa" in Paris, "air" in airport).
FILM_STEMS = (
    "lung", "pulmon", "pleura", "effusion", "pneumothora", "heart", "cardi", "mediastin", "nodul", "consolidat",
    "opacit", "infiltrat", "pneumonia", "oedema", "edema", "atelecta", "emphysema", "catheter", "pacemaker", "pacing",
    "osseous", "fractur", "vertebra", "clavic", "scapul", "diaphragm", "hemidiaphragm", "costophrenic", "trachea",
    "carina", "hilum", "hila", "hilar", "lobe", "lobar", "apic", "basal", "radiograph", "projection", "finding",
    "impression", "abnormal", "silhouette", "aort", "thora", "airspace", "airway", "lucen", "rotat", "inspiration",
    "penetrat", "technique", "enlarg", "widen", "diagnos", "differential", "subcutaneous", "vascul", "calcif",
    "granuloma", "lesion", "opaque", "densit",
)  # fmt: skip
FILM_WORDS = (
    "mass", "masses", "collapse", "line", "lines", "tube", "tubes", "device", "devices", "lead", "leads", "wire",
    "rib", "ribs", "bone", "bones", "spine", "apex", "base", "bases", "film", "films", "x-ray", "xray", "cxr", "image",
    "picture", "view", "pa", "ap", "lateral", "supine", "erect", "report", "normal", "ctr", "ratio", "chest",
    "fluid", "shadow", "shadows", "exposure", "exposed", "tip", "size", "side", "left", "right", "visible", "see",
    "seen", "show", "shown", "describe", "look", "measure", "gas", "air", "vessel", "vessels", "cavity", "zone",
    "region", "soft tissue", "soft tissues",
)  # fmt: skip
_FILM = re.compile(
    r"\b(?:" + "|".join(map(re.escape, FILM_STEMS)) + r")|\b(?:" + "|".join(map(re.escape, FILM_WORDS)) + r")\b",
    re.IGNORECASE,
)

# What no film records: (pattern, how the reason names it).
NOT_ON_A_FILM = (
    (r"\bhow old\b|\bage of\b|\bthe patient'?s age\b|\bborn\b|\bbirthday\b", "the patient's age"),
    (r"\bpatient'?s name\b|\bwho is (the|this) patient\b|\bname of the patient\b", "the patient's name"),
    (r"\bsymptom|\bcomplain|\bfever\b|\bpain\b|\bcough", "the patient's symptoms"),
    (r"\bsmok|\balcohol\b|\ballerg|\bfamily history\b|\bmedical history\b", "the patient's history"),
    (r"\blab(oratory)?\b|\bblood (test|count|pressure)\b|\bwhite (cell|count)\b|\bwbc\b|\bcrp\b|\bsaturation\b"
     r"|\bsp ?o2\b|\bheart rate\b|\btemperature\b", "laboratory values or vital signs"),
    (r"\bmedication|\bdrug|\bdose\b|\bdosage\b|\bprescri|\bantibiotic|\btreat|\btherap|\bsurgery\b|\boperate\b",
     "the treatment"),
    (r"\bprognos|\bsurviv|\blife expectancy\b|\bwill (he|she|they|the patient) (die|recover)\b", "the prognosis"),
    (r"\b(last|previous|prior|earlier|old) (film|x-?ray|radiograph|study|image)s?\b|\bsince last\b"
     r"|\bgotten (worse|better)\b|\bchanged since\b", "a prior film, which is not loaded"),
)  # fmt: skip
_NOT_ON_A_FILM = tuple((re.compile(pattern, re.IGNORECASE), topic) for pattern, topic in NOT_ON_A_FILM)


def confidence_withheld(question: str) -> str | None:
    """Why an answer to this question shows no confidence figure, or None when it may show one."""
    text = " ".join((question or "").split())
    if not text:
        return None
    for pattern, topic in _NOT_ON_A_FILM:
        if pattern.search(text):
            return NOT_FROM_THE_FILM.format(topic=topic)
    if not _FILM.search(text):
        return NOT_ABOUT_THE_FILM
    return None
