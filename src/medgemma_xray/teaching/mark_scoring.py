"""Per-finding scoring of marks on a film (the student's points and boxes, or the model's boxes) against the key:
presence, side, zone and overlap, each with the tolerance the page states (TOLERANCES_TEXT). The read form's
field scoring (teaching.scoring) is separate and unchanged.

For each finding that the key has or the marks claim:
- presence: right when the marks claim it exactly when the key has it;
- side (the patient's: on a PA film the patient's right is the viewer's left): the set of sides the marks fall on
  (their centre left or right of the film's midline) equals the key's. The key's sides come from its regions, or,
  for a teacher's key without regions, from its labels (effusion, pneumothorax, pacemaker side; a lobe's side).
  Not scored where the key gives the finding no side (cardiomegaly, a tube on the midline) or it is not claimed;
- zone: the set of zones the marks fall in equals the zones of the key's regions; a mark whose centre lies inside
  a key region of its finding (grown by POINT_MARGIN) is in that region's zone (a pneumothorax's region spans the
  lung's height, its zone is "upper"), any other in the band of ZONE_BANDS its centre falls in. Scored only where
  the key's regions have zones;
- overlap: every key region is hit by a mark of the finding: a box at IoU >= IOU_HIT, or a point inside the
  region grown by POINT_MARGIN of the film on every side. Needs key regions (phantoms); otherwise not scored.

A finding's mark is never shared between findings; several marks of one finding each count (a bilateral effusion
needs one mark per side).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from medgemma_xray.grounding.boxes import FilmBox, iou
from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels
from medgemma_xray.teaching.marks import Mark, shown_name

IOU_HIT = 0.3
POINT_MARGIN = 0.05  # of the film's height (rows) and width (columns)
# Film-row fractions: upper above the first, lower below the second, middle between (the phantoms' lobes: an
# upper-lobe opacity's centre lies at 24-39 % of the film's height, middle 42-53 %, lower 50-63 %).
ZONE_BANDS = (0.41, 0.51)
TOLERANCES_TEXT = (
    f"Overlap counts at IoU >= {IOU_HIT:g} for a box; a point counts inside the key region grown by "
    f"{POINT_MARGIN:.0%} of the film on each side. Side: the patient's (your mark's centre left or right of the "
    f"midline; the patient's right is on the viewer's left). Zone: the key region's zone where your mark's centre "
    f"lies inside that region, else the band of the film's height it lies in: upper above {ZONE_BANDS[0]:.0%}, "
    f"lower below {ZONE_BANDS[1]:.0%}, middle between."
)


class KeyRegion(Protocol):
    """What scoring reads of a key region (phantoms.regions.Region)."""

    @property
    def finding(self) -> str: ...
    @property
    def side(self) -> str | None: ...
    @property
    def zone(self) -> str | None: ...
    @property
    def box(self) -> FilmBox: ...


@dataclass(frozen=True)
class Check:
    """One criterion of one finding: what the key says, what the marks say, and whether they agree. right is None
    where the criterion is not scored (the reason is in `key`)."""

    key: str
    marked: str
    right: bool | None


@dataclass(frozen=True)
class FindingMarkScore:
    finding: str
    presence: Check
    side: Check
    zone: Check
    overlap: Check

    @property
    def checks(self) -> tuple[Check, ...]:
        return (self.presence, self.side, self.zone, self.overlap)

    @property
    def right(self) -> int:
        return sum(check.right is True for check in self.checks)

    @property
    def scored(self) -> int:
        return sum(check.right is not None for check in self.checks)

    @property
    def label(self) -> str:
        return shown_name(self.finding)


def side_of(mark: Mark) -> str:
    """The patient's side a mark lies on (PA film: the viewer's left half is the patient's right)."""
    return "right" if mark.centre[1] < 0.5 else "left"


def zone_of(y: float) -> str:
    """The band of the film's height a point at row fraction y lies in."""
    if y < ZONE_BANDS[0]:
        return "upper"
    return "middle" if y < ZONE_BANDS[1] else "lower"


def mark_zone(mark: Mark, regions: Sequence[KeyRegion]) -> str:
    """The zone of a mark: that of the first zoned region of its finding its centre lies in, else its band."""
    y, x = mark.centre
    for region in regions:
        if region.zone and _inside(y, x, region.box):
            return region.zone
    return zone_of(y)


def _inside(y: float, x: float, box: FilmBox) -> bool:
    """Inside the box grown by POINT_MARGIN on every side."""
    return box.y0 - POINT_MARGIN <= y <= box.y1 + POINT_MARGIN and box.x0 - POINT_MARGIN <= x <= box.x1 + POINT_MARGIN


def hits(mark: Mark, region: FilmBox) -> tuple[bool, float | None]:
    """(hit, IoU for a box / None for a point) of one mark on one key region."""
    box = mark.film_box()
    if box is None:
        return _inside(mark.y0, mark.x0, region), None
    overlap = iou(box, region)
    return overlap >= IOU_HIT - 1e-12, overlap


def label_sides(key: PhantomLabels, finding: str) -> frozenset[str]:
    """The sides a key's labels give a finding (no regions needed): empty where it has none."""
    if finding == "pleural_effusion" and key.effusion is not None:
        return frozenset(key.effusion.sides)
    if finding == "pneumothorax" and key.pneumothorax is not None:
        return frozenset({key.pneumothorax.side})
    if finding == "pacemaker" and key.pacemaker is not None:
        return frozenset({key.pacemaker.side})
    lobe = {"nodule_or_mass": key.nodule, "consolidation": key.consolidation}.get(finding)
    if lobe is not None:
        return frozenset({lobe.lobe.split()[0]})
    return frozenset()


def _words(values: frozenset[str] | set[str]) -> str:
    return " and ".join(sorted(values)) or "none"


def _score_one(
    finding: str, marks: Sequence[Mark], key: PhantomLabels, regions: Sequence[KeyRegion] | None
) -> FindingMarkScore:
    present = finding in FINDINGS and key.present(finding)
    claimed = bool(marks)
    if finding not in FINDINGS:
        presence = Check("not a finding the key lists", "claimed", False)
    else:
        presence = Check(
            "present" if present else "absent", "claimed" if claimed else "not claimed", claimed == present
        )
    own = [r for r in regions or () if r.finding == finding]
    not_scored = Check("not scored", "", None)
    if not (present and claimed):
        reason = "finding absent" if not present else "not claimed"
        return FindingMarkScore(finding, presence, *(Check(f"not scored ({reason})", "", None),) * 3)
    key_sides = frozenset(r.side for r in own if r.side) if own else label_sides(key, finding)
    marked_sides = {side_of(m) for m in marks}
    side = (
        Check(_words(key_sides), _words(marked_sides), marked_sides == key_sides)
        if key_sides
        else Check("not scored (no side)", _words(marked_sides), None)
    )
    key_zones = frozenset(r.zone for r in own if r.zone)
    marked_zones = {mark_zone(m, own) for m in marks}
    zone = Check(_words(key_zones), _words(marked_zones), marked_zones == key_zones) if key_zones else not_scored
    if not own:
        overlap = Check("not scored (no key region)", "", None)
    else:
        found = []
        for region in own:
            results = [hits(mark, region.box) for mark in marks]
            best = max((value for _, value in results if value is not None), default=None)
            found.append((any(hit for hit, _ in results), best))
        described = "; ".join(
            ("hit" if hit else "missed") + (f" (IoU {best:.2f})" if best is not None else "") for hit, best in found
        )
        overlap = Check(f"{len(own)} region(s)", described, all(hit for hit, _ in found))
    return FindingMarkScore(finding, presence, side, zone, overlap)


def score_marks(
    marks: Sequence[Mark], key: PhantomLabels, regions: Sequence[KeyRegion] | None = None
) -> tuple[FindingMarkScore, ...]:
    """Every finding the key has or the marks claim, in FINDINGS order (typed names after), scored.
    regions: the key's regions on this film (phantoms.regions.finding_regions), or None where there are none
    (a teacher's key on a real film: overlap and zone are then not scored)."""
    claimed = {m.finding for m in marks}
    names = [f for f in FINDINGS if key.present(f) or f in claimed]
    names += sorted(claimed - set(FINDINGS))
    return tuple(_score_one(name, [m for m in marks if m.finding == name], key, regions) for name in names)


def summary(scores: Sequence[FindingMarkScore]) -> str:
    """e.g. "7/9 checks right on 3 findings"."""
    right, scored = sum(s.right for s in scores), sum(s.scored for s in scores)
    if not scores:
        return "nothing to score: the key has no findings and nothing was marked"
    return f"{right}/{scored} checks right on {len(scores)} finding(s)"
