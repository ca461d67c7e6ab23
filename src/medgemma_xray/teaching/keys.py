"""The answer key: the phantom's sidecar labels, or a teacher's key file in the same schema for a real film.

The schema is medgemma_xray.phantoms.findings.PhantomLabels as JSON (labels_version 1). A teacher's key may leave out `seed`
and `synthetic`; everything else is checked here, so a bad key is refused with every problem listed at once
(which field, what was found, what is allowed), never with a traceback from deep inside a dataclass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import cast

from medgemma_xray.phantoms.findings import (
    CENTRAL_LINE_ROUTES,
    CENTRAL_LINE_TIPS,
    EFFUSION_SIZES,
    LABELS_VERSION,
    LOBES,
    PhantomLabels,
)

ALL_LOBES = tuple(lobe for lobes in LOBES.values() for lobe in lobes)
MAX_KEY_BYTES = 64 << 10  # a key is under 1 KiB; a larger file is not a key
MAX_PROBLEMS = 12  # problems listed in one refusal; the rest are counted
MAX_SHOWN = 40  # characters of a found value quoted in a problem
SIDES = ("right", "left")
TEACHER_KEY_NOTICE = "teacher's key"  # `synthetic` of a key for a real film: what the labels are


class AnswerKeyError(ValueError):
    """A key file that does not follow the schema; the message lists every problem found."""


def _found(value: object) -> str:
    """A value as quoted in a problem: its repr, cut to MAX_SHOWN characters (a key's values are short words)."""
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def _named(name: str) -> str:
    """A field name from the file, as named in a problem: cut to MAX_SHOWN characters."""
    return name if len(name) <= MAX_SHOWN else name[: MAX_SHOWN - 1] + "…"


def _choice(allowed: tuple[str, ...]) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if isinstance(value, str) and value in allowed:
            return None
        return f"found {_found(value)}; expected one of: {', '.join(allowed)}"

    return check


def _number(low: float, high: float, unit: str = "") -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"found {_found(value)}; expected a number between {low:g} and {high:g}{unit}"
        if not low <= value <= high:
            return f"found {value:g}; expected a number between {low:g} and {high:g}{unit}"
        return None

    return check


def _boolean(value: object) -> str | None:
    return None if isinstance(value, bool) else f"found {_found(value)}; expected true or false"


# Each object in the key: its attributes and their checks. None for a finding means "absent".
SCHEMA: dict[str, dict[str, Callable[[object], str | None]]] = {
    "heart": {"cardiothoracic_ratio": _number(0.2, 0.9)},
    "technique": {
        "rotated": _boolean,
        "inspiration": _choice(("adequate", "poor")),
        "exposure": _choice(("adequate", "under", "over")),
    },
    "effusion": {"side": _choice(("right", "left", "both")), "size": _choice(EFFUSION_SIZES)},
    "pneumothorax": {"side": _choice(SIDES), "size": _choice(("small", "large"))},
    "nodule": {"lobe": _choice(ALL_LOBES), "size_cm": _number(0.3, 15.0, " cm")},
    "consolidation": {"lobe": _choice(ALL_LOBES)},
    "endotracheal_tube": {"tip_above_carina_cm": _number(-5.0, 15.0, " cm")},
    "central_line": {"route": _choice(CENTRAL_LINE_ROUTES), "tip": _choice(CENTRAL_LINE_TIPS)},
    "pacemaker": {"side": _choice(SIDES)},
}
REQUIRED = ("heart", "technique")  # every film has a heart and a technique; the findings may be null
OPTIONAL_TOP = {"labels_version", "seed", "synthetic"}


def validate_key(record: object) -> list[str]:
    """Every problem with a key record (a parsed JSON object), as 'where: what' lines; empty when it is valid."""
    if not isinstance(record, dict):
        return [f"the key must be a JSON object, found {type(record).__name__}"]
    problems = []
    version = record.get("labels_version", LABELS_VERSION)
    if version != LABELS_VERSION:
        problems.append(f"labels_version: found {_found(version)}; this code reads version {LABELS_VERSION}")
    for name in sorted(set(record) - set(SCHEMA) - OPTIONAL_TOP):
        problems.append(f"{_named(name)}: not a field of the key; the fields are {', '.join(SCHEMA)}")
    for name in REQUIRED:
        if record.get(name) is None:
            problems.append(f"{name}: missing; every key needs it ({', '.join(SCHEMA[name])})")
    for name, attributes in SCHEMA.items():
        value = record.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            problems.append(
                f"{name}: found {_found(value)}; expected null (absent) or an object with {', '.join(attributes)}"
            )
            continue
        for extra in sorted(set(value) - set(attributes)):
            problems.append(f"{name}.{_named(extra)}: not an attribute of {name}; expected {', '.join(attributes)}")
        for attribute, check in attributes.items():
            if attribute not in value:
                problems.append(f"{name}.{attribute}: missing")
            elif (problem := check(value[attribute])) is not None:
                problems.append(f"{name}.{attribute}: {problem}")
    seed = record.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        problems.append(f"seed: found {_found(seed)}; expected a whole number (or leave it out)")
    return problems


def key_from_record(record: object, where: str = "the key") -> PhantomLabels:
    """A validated key as PhantomLabels. Raises AnswerKeyError listing every problem. `where` names the key in
    the message (a case title, never an uploaded file's name)."""
    problems = validate_key(record)
    if problems:
        listed = "\n".join(f"- {p}" for p in problems[:MAX_PROBLEMS])
        if len(problems) > MAX_PROBLEMS:
            listed += f"\n- and {len(problems) - MAX_PROBLEMS} more problems"
        raise AnswerKeyError(
            f"{where} does not follow the answer-key schema (docs/teaching_cases.md):\n{listed}\n"
            "Fix these fields and load it again."
        )
    full = {
        "labels_version": LABELS_VERSION,
        "seed": 0,
        "synthetic": TEACHER_KEY_NOTICE,
        **cast("dict[str, object]", record),
    }  # validate_key found a JSON object
    return PhantomLabels.from_json(json.dumps(full))


def key_from_json(text: str | bytes, where: str = "the key") -> PhantomLabels:
    """Parse and validate a key file's text: at most MAX_KEY_BYTES, nested no deeper than a key is."""
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > MAX_KEY_BYTES:
        raise AnswerKeyError(
            f"{where} is {size / 1024:,.0f} KiB; an answer key is a short JSON object (under 1 KiB, at most "
            f"{MAX_KEY_BYTES >> 10} KiB). Check that this is the key file."
        )
    try:
        record = json.loads(text)
    except RecursionError:
        raise AnswerKeyError(
            f"{where} nests its JSON far deeper than a key (an object of objects); check that this is the key file."
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = f"line {exc.lineno}, column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else ""
        raise AnswerKeyError(
            f"{where} is not valid JSON ({detail or 'not UTF-8 text'}); save it as UTF-8 JSON."
        ) from None
    return key_from_record(record, where)
