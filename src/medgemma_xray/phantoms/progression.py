"""Progression pairs: a prior and a current film of the same phantom patient, and what changed between them.

The patient is one geometry seed: both films are drawn by labelled_phantom(seed, labels=...) with the same seed and
technique, so the anatomy (lungs, heart, ribs, the position of every finding both films share) is the same; only
the labelled change differs. The current film gets its own exposure noise and contrast, as a second film on
another day would, so two films of an unchanged patient are never identical pixel for pixel.

Change vocabulary (Change.kind), one per kind of pair the generator draws:
- "grew" / "shrank": a pleural effusion got larger or smaller (same side);
- "appeared": a nodule or mass that the prior did not show;
- "removed" / "inserted": an endotracheal tube or a central venous line taken out or put in;
and no change at all is an empty `changes` tuple ("unchanged" is never a Change). Change.text is the clause
change_statement writes; parse_change_statement reads any statement back into (finding, kind) pairs.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from medgemma_xray.phantoms.findings import (
    CENTRAL_LINE_ROUTES,
    CENTRAL_LINE_TIPS,
    EFFUSION_SIZES,
    LOBES,
    CentralLine,
    Effusion,
    EndotrachealTube,
    LungOpacity,
    PhantomLabels,
    sample_labels,
)

if TYPE_CHECKING:
    from medgemma_xray.phantoms.labelled import LabelledPhantom

CHANGE_KINDS = ("grew", "shrank", "appeared", "removed", "inserted")
PAIR_KINDS = ("effusion_grew", "effusion_shrank", "nodule_appeared", "device_removed", "device_inserted", "unchanged")
PAIR_WEIGHTS = (0.2, 0.1, 0.2, 0.15, 0.1, 0.25)
NO_CHANGE = "Compared with the prior: No interval change."
STATEMENT_HEAD = "Compared with the prior: "
_DEVICE_NAMES = {"endotracheal_tube": "endotracheal tube", "central_line": "central venous line"}


@dataclass(frozen=True)
class Change:
    finding: str  # one of phantoms.findings.FINDINGS
    kind: str  # one of CHANGE_KINDS
    text: str  # the clause change_statement writes for it


@dataclass(frozen=True)
class ProgressionPair:
    seed: int
    kind: str  # one of PAIR_KINDS
    prior: LabelledPhantom
    current: LabelledPhantom
    changes: tuple[Change, ...]


def _effusion_side_clear(labels: PhantomLabels, side: str) -> PhantomLabels:
    """The labels with nothing a moderate or large effusion on `side` would hide or contradict there (a
    pneumothorax on that side, a nodule or consolidation in that lower lobe)."""
    changes: dict[str, Any] = {}
    if labels.pneumothorax is not None and labels.pneumothorax.side == side:
        changes["pneumothorax"] = None
    for name in ("nodule", "consolidation"):
        finding = getattr(labels, name)
        if finding is not None and finding.lobe == f"{side} lower lobe":
            changes[name] = None
    return dataclasses.replace(labels, **changes)


def _free_lobe(labels: PhantomLabels, rng: np.random.Generator) -> str:
    taken = {labels.consolidation.lobe} if labels.consolidation else set()
    hidden = set()
    if labels.effusion is not None and labels.effusion.size != "small":
        hidden = {f"{side} lower lobe" for side in labels.effusion.sides}
    collapsed = labels.pneumothorax.side if labels.pneumothorax and labels.pneumothorax.size == "large" else None
    lobes = [lobe for side, names in LOBES.items() for lobe in names if side != collapsed]
    candidates = [lobe for lobe in lobes if lobe not in taken | hidden]
    return str(rng.choice(candidates or ["right upper lobe"]))


def _labels_pair(base: PhantomLabels, kind: str, rng: np.random.Generator):
    """(prior labels, current labels, changes) for one kind of pair, built around the patient's own labels."""
    if kind in ("effusion_grew", "effusion_shrank"):
        side = str(rng.choice(["right", "left", "both"], p=[0.4, 0.4, 0.2]))
        smaller, larger = sorted(rng.choice(len(EFFUSION_SIZES), size=2, replace=False))
        labels = base
        for one in ("right", "left") if side == "both" else (side,):
            labels = _effusion_side_clear(labels, one)
        before = Effusion(side, EFFUSION_SIZES[smaller])
        after = Effusion(side, EFFUSION_SIZES[larger])
        if kind == "effusion_shrank":
            before, after = after, before
        where = "bilateral pleural effusions have" if side == "both" else f"{side} pleural effusion has"
        verb = "grown" if kind == "effusion_grew" else "shrunk"
        text = f"the {where} {verb}, {before.size} to {after.size}"
        change = Change("pleural_effusion", "grew" if kind == "effusion_grew" else "shrank", text)
        return dataclasses.replace(labels, effusion=before), dataclasses.replace(labels, effusion=after), (change,)
    if kind == "nodule_appeared":
        prior = dataclasses.replace(base, nodule=None)
        nodule = base.nodule or LungOpacity(_free_lobe(prior, rng), round(float(rng.uniform(1.5, 4.5)), 1))
        text = f"a {nodule.size_cm:.0f} cm {nodule.kind} has appeared in the {nodule.lobe}"
        return prior, dataclasses.replace(base, nodule=nodule), (Change("nodule_or_mass", "appeared", text),)
    if kind in ("device_removed", "device_inserted"):
        finding = str(rng.choice(list(_DEVICE_NAMES)))
        device: EndotrachealTube | CentralLine
        if finding == "endotracheal_tube":
            device = base.endotracheal_tube or EndotrachealTube(round(float(rng.uniform(2.0, 7.0)), 1))
        else:
            device = base.central_line or CentralLine(
                str(rng.choice(CENTRAL_LINE_ROUTES)), str(rng.choice(CENTRAL_LINE_TIPS))
            )
        present: dict[str, Any] = {finding: device}
        absent: dict[str, Any] = {finding: None}
        with_device, without = dataclasses.replace(base, **present), dataclasses.replace(base, **absent)
        if kind == "device_removed":
            text = f"the {_DEVICE_NAMES[finding]} has been removed"
            return with_device, without, (Change(finding, "removed", text),)
        text = f"an {_DEVICE_NAMES[finding]} has been inserted"
        return without, with_device, (Change(finding, "inserted", text),)
    if kind == "unchanged":
        return base, base, ()
    raise ValueError(f"unknown pair kind {kind!r}; choose from {', '.join(PAIR_KINDS)}")


def progression_pair(seed: int, kind: str | None = None, rows: int = 512) -> ProgressionPair:
    """The pair of this seed (its kind drawn from PAIR_WEIGHTS unless given): prior and current film of the same
    patient (geometry seed = `seed`, width drawn from it), and the changes from the prior to the current film."""
    from medgemma_xray.phantoms.labelled import draw_film, expose

    kind, prior_labels, current_labels, changes = pair_labels(seed, kind)
    prior = expose(draw_film(seed, rows, None, prior_labels), prior_labels)
    drawn = draw_film(seed, rows, None, current_labels)
    # Another day, another exposure: the current film's noise and contrast come from their own stream.
    current = expose(dataclasses.replace(drawn, rng=np.random.default_rng([seed, 0xF11, 0xDA7])), current_labels)
    return ProgressionPair(seed, kind, prior, current, changes)


def pair_labels(seed: int, kind: str | None = None):
    """(kind, prior labels, current labels, changes) of progression_pair(seed, kind), without drawing the films."""
    rng = np.random.default_rng([seed, 0x9A12])
    drawn_kind = str(rng.choice(PAIR_KINDS, p=PAIR_WEIGHTS))
    kind = drawn_kind if kind is None else kind
    prior, current, changes = _labels_pair(sample_labels(seed), kind, rng)
    return kind, prior, current, changes


def pair_kind(seed: int) -> str:
    """The kind of pair progression_pair(seed) draws, without drawing the films."""
    return str(np.random.default_rng([seed, 0x9A12]).choice(PAIR_KINDS, p=PAIR_WEIGHTS))


def change_statement(changes: tuple[Change, ...]) -> str:
    """The demo model's answer to the comparison prompt: one fixed-format sentence (parse_change_statement's input)."""
    if not changes:
        return NO_CHANGE
    clauses = "; ".join(change.text for change in changes)
    return STATEMENT_HEAD + clauses[0].upper() + clauses[1:] + "."


_FINDING_WORDS = (
    ("pleural_effusion", re.compile(r"\beffusions?\b")),
    ("nodule_or_mass", re.compile(r"\b(nodule|mass)\b")),
    ("endotracheal_tube", re.compile(r"\bendotracheal tube\b")),
    ("central_line", re.compile(r"\bcentral (venous )?line\b")),
    ("pneumothorax", re.compile(r"\bpneumothorax\b")),
    ("consolidation", re.compile(r"\bconsolidation\b")),
    ("pacemaker", re.compile(r"\bpacemaker\b")),
)
_KIND_WORDS = (
    ("grew", re.compile(r"\b(grown|grew|increased|larger)\b")),
    ("shrank", re.compile(r"\b(shrunk|shrank|decreased|smaller)\b")),
    ("appeared", re.compile(r"\b(appeared|new)\b")),
    ("removed", re.compile(r"\bremoved\b")),
    ("inserted", re.compile(r"\b(inserted|placed)\b")),
)


def parse_change_statement(text: str) -> frozenset[tuple[str, str]] | None:
    """The (finding, kind) pairs a comparison answer states; an empty set for 'no interval change'; None when the
    answer says neither (counted wrong by the evaluation)."""
    body = text.strip().lower()
    if "no interval change" in body or "no change" in body:
        return frozenset()
    if STATEMENT_HEAD.strip().lower() in body:
        body = body.split(STATEMENT_HEAD.strip().lower(), 1)[1]
    found = set()
    for clause in re.split(r"[;.]", body):
        finding = next((name for name, words in _FINDING_WORDS if words.search(clause)), None)
        kind = next((name for name, words in _KIND_WORDS if words.search(clause)), None)
        if finding is not None and kind is not None:
            found.add((finding, kind))
    return frozenset(found) if found else None
