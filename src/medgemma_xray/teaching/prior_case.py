"""A library case's prior film: the sidecar's optional `prior` object (docs/teaching_cases.md), validated like the
rest of the sidecar (every problem named, with what was expected).

    "prior": {
      "film": "case-017.prior.png",      # a film file in the same folder (a plain file name)
      "interval": "3 months earlier",    # shown on the viewer above the prior
      "key": { ... } or null,            # the prior film's answer key (optional)
      "changes": [{"finding": "pleural_effusion", "kind": "grew", "text": "The right effusion has grown."}]
    }

`changes` is the pair's change key: the student's "what changed" read is scored against it
(teaching/change_scoring.py). Its findings are phantoms.findings.FINDINGS, its kinds phantoms.progression's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels
from medgemma_xray.teaching.keys import key_from_record, validate_key

PRIOR_FIELDS = {"film", "interval", "key", "changes"}
CHANGE_FIELDS = {"finding", "kind", "text"}
PRIOR_FILM_SUFFIXES = (".dcm", ".dicom", ".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class CaseChange:
    finding: str  # one of FINDINGS
    kind: str  # one of phantoms.progression's change kinds
    text: str  # the change in words ("The right effusion has grown.")


@dataclass(frozen=True)
class PriorFilm:
    film_path: Path
    interval: str  # e.g. "3 months earlier": the viewer's label of the prior
    key: PhantomLabels | None = None
    changes: tuple[CaseChange, ...] | None = None  # None: no change key (nothing to score)


def _changes(record: object, kinds: tuple[str, ...], problems: list[str]) -> tuple[CaseChange, ...] | None:
    if record is None:
        return None
    if not isinstance(record, list):
        problems.append("prior.changes: expected a list of {finding, kind, text} objects")
        return None
    changes = []
    for number, change in enumerate(record, start=1):
        where = f"prior.changes[{number}]"
        if not isinstance(change, dict) or set(change) != CHANGE_FIELDS:
            problems.append(f"{where}: expected an object with exactly finding, kind, text")
            continue
        finding, kind, text = change["finding"], change["kind"], change["text"]
        if finding not in FINDINGS:
            problems.append(f"{where}.finding: found {finding!r}; expected one of: {', '.join(FINDINGS)}")
        if kind not in kinds:
            problems.append(f"{where}.kind: found {kind!r}; expected one of: {', '.join(kinds)}")
        if not isinstance(text, str):
            problems.append(f"{where}.text: expected text")
        if finding in FINDINGS and kind in kinds and isinstance(text, str):
            changes.append(CaseChange(finding, kind, text.strip()))
    if len({c.finding for c in changes}) < len(changes):
        problems.append("prior.changes: a finding is listed twice; give each finding one change")
    return tuple(changes)


def prior_from_record(record: object, folder: Path, own_film: Path, problems: list[str]) -> PriorFilm | None:
    """The prior of a case whose sidecar and film are in `folder` (own_film: the case's film, which cannot be its
    prior); None with `problems` appended (each naming the field) when it is not valid."""
    from medgemma_xray.teaching.change_scoring import change_kinds

    if not isinstance(record, dict):
        problems.append(f"prior: expected an object ({', '.join(sorted(PRIOR_FIELDS))}), found {type(record).__name__}")
        return None
    start = len(problems)
    for name in sorted(set(record) - PRIOR_FIELDS):
        problems.append(f"prior.{name}: not a prior field; the fields are {', '.join(sorted(PRIOR_FIELDS))}")
    name = record.get("film")
    film_path = None
    if not isinstance(name, str) or not name.strip():
        problems.append("prior.film: missing; expected the prior film's file name in the case's folder")
    elif Path(name).name != name or name.startswith("."):
        problems.append("prior.film: expected a plain file name in the case's folder (no folder, no leading dot)")
    elif not name.lower().endswith(PRIOR_FILM_SUFFIXES):
        problems.append(f"prior.film: expected a film ({', '.join(PRIOR_FILM_SUFFIXES)})")
    elif not (folder / name).is_file():
        problems.append("prior.film: no such file in the case's folder; put the prior film beside the case's film")
    elif (folder / name).resolve() == own_film.resolve():
        problems.append("prior.film: this is the case's own film; name the earlier film")
    else:
        film_path = folder / name
    interval = record.get("interval")
    if not isinstance(interval, str) or not interval.strip():
        problems.append('prior.interval: missing or empty; expected text such as "3 months earlier"')
    key = None
    if record.get("key") is not None:
        key_problems = validate_key(record["key"])
        problems.extend(f"prior.key.{problem}" for problem in key_problems)
        key = None if key_problems else key_from_record(record["key"], "prior.key")
    changes = _changes(record.get("changes"), change_kinds(), problems)
    if len(problems) > start or film_path is None or not isinstance(interval, str):
        return None
    return PriorFilm(film_path=film_path, interval=interval.strip(), key=key, changes=changes)


def prior_record(film_name: str, interval: str, key: dict | None, changes: list[CaseChange] | None) -> dict:
    """The sidecar's prior object (the starter set's writer)."""
    return {
        "film": film_name,
        "interval": interval,
        "key": key,
        "changes": None
        if changes is None
        else [{"finding": c.finding, "kind": c.kind, "text": c.text} for c in changes],
    }
