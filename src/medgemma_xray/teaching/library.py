"""The case library: a folder of films, each with a sidecar `<stem>.case.json` (history, answer key, teaching
points). The schema is documented in docs/teaching_cases.md; `python -m medgemma_xray.teaching.library --output DIR` writes a
starter set from labelled phantoms.

A case is named in the UI and in every export by its sidecar's title, never by its file name (a teacher's file
names may hold patient names). A broken sidecar does not hide the rest of the library: it is listed in
`Library.problems`, with what to fix.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from medgemma_xray.phantoms.findings import PhantomLabels
from medgemma_xray.teaching.keys import AnswerKeyError, key_from_record
from medgemma_xray.teaching.prior_case import PriorFilm, prior_from_record

logger = logging.getLogger(__name__)

CASE_FORMAT = 1
SIDECAR_SUFFIX = ".case.json"
FILM_SUFFIXES = (".dcm", ".dicom", ".png", ".jpg", ".jpeg")
CASE_FIELDS = {"case_format", "title", "history", "key", "teaching_points", "comparison", "prior"}
STARTER_PAIRS = 4  # follow-up cases (a prior film and a change key) in the library the server writes
STARTER_SEED = 900_000  # held out from training (seeds below 1,000,000) and from the evaluation's low seeds


@dataclass(frozen=True)
class LibraryCase:
    case_id: str  # the file stem: for finding the files only, never shown or exported
    title: str
    film_path: Path
    history: str
    key: PhantomLabels | None = None
    teaching_points: tuple[str, ...] = field(default=())
    comparison: str = ""
    prior: PriorFilm | None = None  # an earlier film of the same patient (teaching/prior_case.py)


@dataclass(frozen=True)
class Library:
    cases: tuple[LibraryCase, ...]
    problems: tuple[str, ...] = field(default=())

    def get(self, case_id: str) -> LibraryCase:
        for case in self.cases:
            if case.case_id == case_id:
                return case
        raise KeyError(f"no case {case_id!r} in the library")

    def choices(self) -> list[tuple[str, str]]:
        """(title, case id) pairs for a dropdown."""
        return [(case.title, case.case_id) for case in self.cases]


T = TypeVar("T")


def shuffled(cases: Sequence[T], seed: int | None = None) -> list[T]:
    """The cases (or case ids) in a random order for a quiz (a seed repeats an order)."""
    order = list(cases)
    random.Random(seed).shuffle(order)
    return order


def case_from_record(record: object, case_id: str, film_path: Path) -> LibraryCase:
    """A case from its parsed sidecar; raises ValueError naming every problem."""
    if not isinstance(record, dict):
        raise ValueError(f"the sidecar must be a JSON object, found {type(record).__name__}")
    problems = []
    if record.get("case_format") != CASE_FORMAT:
        problems.append(f"case_format: found {record.get('case_format')!r}; expected {CASE_FORMAT}")
    for name in sorted(set(record) - CASE_FIELDS):
        problems.append(f"{name}: not a case field; the fields are {', '.join(sorted(CASE_FIELDS))}")
    for name in ("title", "history"):
        if not isinstance(record.get(name), str) or not record[name].strip():
            problems.append(f"{name}: missing or empty; expected text")
    points = record.get("teaching_points", [])
    if not isinstance(points, list) or not all(isinstance(p, str) for p in points):
        problems.append("teaching_points: expected a list of strings")
    if not isinstance(record.get("comparison", ""), str):
        problems.append("comparison: expected text")
    key = None
    if record.get("key") is not None:
        try:
            key = key_from_record(record["key"], "key")
        except AnswerKeyError as exc:
            problems.append(str(exc).split("\n", 1)[1].rsplit("\n", 1)[0].replace("- ", "key.", 1))
    prior = None
    if record.get("prior") is not None:
        prior = prior_from_record(record["prior"], film_path.parent, film_path, problems)
    if problems:
        raise ValueError("; ".join(problems))
    return LibraryCase(
        case_id=case_id,
        title=record["title"].strip(),
        film_path=film_path,
        history=record["history"].strip(),
        key=key,
        teaching_points=tuple(points),
        comparison=record.get("comparison", "").strip(),
        prior=prior,
    )


def load_library(folder: Path) -> Library:
    """Every case in `folder` (a film with a `.case.json` sidecar), ordered by title."""
    folder = Path(folder)
    if not folder.is_dir():
        return Library((), (f"The case library folder does not exist ({folder.name}); set CASE_LIBRARY.",))
    cases: list[LibraryCase] = []
    problems: list[str] = []
    for sidecar in sorted(folder.glob(f"*{SIDECAR_SUFFIX}")):
        stem = sidecar.name[: -len(SIDECAR_SUFFIX)]
        films = [folder / f"{stem}{suffix}" for suffix in FILM_SUFFIXES if (folder / f"{stem}{suffix}").is_file()]
        label = f"case {len(cases) + len(problems) + 1}"
        if not films:
            problems.append(f"{label}: a sidecar without a film beside it (expected {', '.join(FILM_SUFFIXES)})")
            continue
        try:
            record = json.loads(sidecar.read_text(encoding="utf-8"))
            cases.append(case_from_record(record, stem, films[0]))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            problems.append(f"{label}: the sidecar is not UTF-8 JSON ({type(exc).__name__})")
        except ValueError as exc:
            problems.append(f"{label}: {exc}")
    for problem in problems:
        logger.warning("case library: %s", problem)
    return Library(tuple(sorted(cases, key=lambda c: c.title)), tuple(problems))


# --- the starter set -------------------------------------------------------------------------------------------


# A story per finding, in the order one leads a history: (age range, the story, the clinical question). Ages fit
# who has such a film: a spontaneous pneumothorax in a tall young adult, a pacemaker or cardiomegaly in old age, a
# mass in a long-term smoker.
HISTORIES: dict[str, tuple[tuple[int, int], str, str]] = {
    "line_pneumothorax": ((35, 80), "desaturated an hour after a {route} central line insertion",
                          "pneumothorax? line tip position?"),
    "endotracheal_tube": ((30, 80), "intubated on the intensive care unit for {reason}", "ET tube position?"),
    "central_line": ((30, 85), "{route} central line inserted for {line_use}; not yet used", "line tip position?"),
    "pneumothorax": ((18, 34), "tall and thin; sudden {side}-sided pleuritic chest pain and breathlessness at rest",
                     "pneumothorax?"),
    "pneumothorax_copd": ((55, 85), "long-standing COPD; sudden {side}-sided pleuritic chest pain and breathlessness",
                          "pneumothorax?"),
    "pacemaker": ((70, 89), "pacemaker for complete heart block, placed last year; dizzy spells again", "lead position?"),
    "nodule_or_mass": ((55, 80), "smoker of 40 pack-years with weight loss and haemoptysis", "mass?"),
    "cardiomegaly": ((62, 88), "ankle swelling and breathlessness on exertion; known ischaemic heart disease",
                     "heart failure?"),
    "pleural_effusion": ((50, 85), "two weeks of increasing breathlessness; dull to percussion at one base",
                         "effusion?"),
    "consolidation": ((20, 80), "three days of fever and a productive cough; crackles on auscultation",
                      "pneumonia?"),
    "normal": ((20, 60), "pre-operative chest film before a hernia repair; no chest symptoms", "fit for anaesthesia?"),
}  # fmt: skip


def _stories(labels: PhantomLabels) -> list[str]:
    """The history's stories for this film, the leading one first."""
    present = [name for name in FINDINGS_ORDER if labels.present(name)]
    if labels.central_line is not None and labels.pneumothorax is not None:  # the line's complication leads
        present = [
            "line_pneumothorax" if name == "central_line" else name for name in present if name != "pneumothorax"
        ]
    if labels.endotracheal_tube is not None and labels.central_line is not None:
        present = [n for n in present if n != "central_line"]  # the ICU story names the line in its question
    if "pneumothorax" in present and any(HISTORIES[n][0][0] >= 50 for n in present):
        present = ["pneumothorax_copd" if n == "pneumothorax" else n for n in present]  # an older patient's
    return present or ["normal"]


FINDINGS_ORDER = (
    "endotracheal_tube", "central_line", "pneumothorax", "pacemaker", "nodule_or_mass", "cardiomegaly",
    "pleural_effusion", "consolidation",
)  # fmt: skip


def history_line(labels: PhantomLabels, seed: int) -> str:
    """A clinical history that fits the phantom's findings without naming them outright: an age and sex drawn
    from who has such a film, one or two stories, and the clinical question the film was taken to answer."""
    rng = random.Random(seed)
    stories = _stories(labels)
    low, high = HISTORIES[stories[0]][0]
    for name in stories[1:]:  # narrowed to an age that fits every story, where one does
        other_low, other_high = HISTORIES[name][0]
        if max(low, other_low) <= min(high, other_high):
            low, high = max(low, other_low), min(high, other_high)
    age = rng.randint(low, high)
    sex = rng.choice(("man", "woman"))
    reason = "pneumonia" if labels.consolidation is not None else "respiratory failure after a cardiac arrest"
    line_use = "intravenous antibiotics" if labels.consolidation is not None else "parenteral nutrition"
    route = labels.central_line.route if labels.central_line is not None else ""
    side = labels.pneumothorax.side if labels.pneumothorax is not None else ""
    texts = [
        HISTORIES[name][1].format(route=route, reason=reason, line_use=line_use, side=side) for name in stories[:2]
    ]
    question = HISTORIES[stories[0]][2]
    if "line_pneumothorax" in stories:
        question = HISTORIES["line_pneumothorax"][2]
    elif stories[0] == "endotracheal_tube" and labels.central_line is not None:
        question = "ET tube and central line positions?"
    return f"{age}-year-old {sex}: {'; '.join(texts)}. Clinical question: {question}"


def teaching_points(labels: PhantomLabels) -> list[str]:
    points = [
        f"Cardiothoracic ratio {labels.heart.cardiothoracic_ratio:.2f}: the widest heart diameter over the widest "
        "inner thoracic diameter on a PA film; above 0.50 is enlarged."
    ]
    if labels.nodule is not None:
        points.append(
            f"A {labels.nodule.size_cm:.1f} cm opacity in the {labels.nodule.lobe} is a {labels.nodule.kind} "
            "(3 cm or more is a mass): measure it, do not estimate it."
        )
    if labels.central_line is not None:
        points.append(f"The central line tip lies at the {labels.central_line.tip}; the target is the lower SVC.")
    if labels.endotracheal_tube is not None:
        points.append(
            f"ET tube tip {labels.endotracheal_tube.tip_above_carina_cm:.1f} cm above the carina (aim for 3-7 cm)."
        )
    if labels.pneumothorax is not None:
        points.append("Look for the visceral pleural line and absent lung markings beyond it.")
    if labels.effusion is not None:
        points.append("A meniscus at the costophrenic angle means fluid; a small effusion only blunts the angle.")
    return points


def write_starter_set(
    folder: Path, count: int = 8, start_seed: int = STARTER_SEED, rows: int = 512, pairs: int = 0
) -> list[Path]:
    """Labelled phantoms as library cases (odd seeds 12-bit DICOM with pixel spacing, even seeds 8-bit PNG, which
    has none), each with a history line, the labels as the key, and teaching points; then `pairs` follow-up cases
    (teaching/starter_pairs.py), each with its prior film and change key. Returns the (current) films."""
    from medgemma_xray.phantoms.films import dicom_bytes, png_bytes, quantize
    from medgemma_xray.phantoms.labelled import FILM_HEIGHT_CM, labelled_phantom

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for number, seed in enumerate(range(start_seed, start_seed + count), start=1):
        phantom = labelled_phantom(seed, rows)
        stem = f"phantom_case_{seed:06d}"
        if seed % 2:
            film = folder / f"{stem}.dcm"
            film.write_bytes(
                dicom_bytes(
                    quantize(phantom.film, 12),
                    bits_stored=12,
                    window=(2048, 4096),
                    patient_id=f"SYNTHETIC-{seed:06d}",
                    pixel_spacing_mm=10 * FILM_HEIGHT_CM / rows,
                )
            )
        else:
            film = folder / f"{stem}.png"
            film.write_bytes(png_bytes(quantize(phantom.film, 8)))
        key = json.loads(phantom.labels.to_json())
        record = {
            "case_format": CASE_FORMAT,
            "title": f"Phantom case {number:02d}",
            "history": history_line(phantom.labels, seed),
            "comparison": "None available.",
            "key": key,
            "teaching_points": teaching_points(phantom.labels),
        }
        (folder / f"{stem}{SIDECAR_SUFFIX}").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        written.append(film)
    return written + _write_starter_pairs(folder, pairs)


def _write_starter_pairs(folder: Path, count: int) -> list[Path]:
    from medgemma_xray.teaching.prior_case import prior_record
    from medgemma_xray.teaching.starter_pairs import PAIR_SEED, write_pair_films

    written = []
    for number, seed in enumerate(range(PAIR_SEED, PAIR_SEED + count), start=1):
        pair = write_pair_films(folder, seed)
        record = {
            "case_format": CASE_FORMAT,
            "title": f"Phantom follow-up {number:02d}",
            "history": history_line(pair.current_labels, seed),
            "comparison": f"Prior chest film, {pair.interval}.",
            "key": json.loads(pair.current_labels.to_json()),
            "teaching_points": [
                *(f"Since the prior: {c.text}" for c in pair.changes if c.kind != "unchanged"),
                *teaching_points(pair.current_labels),
            ],
            "prior": prior_record(
                pair.prior_name, pair.interval, json.loads(pair.prior_labels.to_json()), list(pair.changes)
            ),
        }
        (folder / f"{pair.stem}{SIDECAR_SUFFIX}").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        written.append(pair.film)
    return written


def main(argv: list[str] | None = None) -> int:
    """Write a starter case library of labelled synthetic phantoms (every film marked SYNTHETIC)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--output", type=Path, required=True, help="the library folder (created)")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--start_seed", type=int, default=STARTER_SEED)
    parser.add_argument("--pairs", type=int, default=STARTER_PAIRS, help="follow-up cases with a prior film")
    args = parser.parse_args(argv)
    films = write_starter_set(args.output, args.count, args.start_seed, pairs=args.pairs)
    print(f"wrote {len(films)} cases into {args.output}")  # a command line's own output, not library logging
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
