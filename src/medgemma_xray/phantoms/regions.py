"""Where each finding of a labelled phantom is: the ground-truth boxes that localisation is taught and scored with.

A region is the bounding box of the pixels the generator drew for that finding (phantoms.labelled.draw_film
records them), so it covers exactly what the film shows, at the film's own size:

- pleural effusion: the fluid, one region per side; zone "lower";
- pneumothorax: the air space beyond the visceral pleura and the pleural line; zone "upper" (air rises to the
  apex on an erect film, where the rim is widest);
- nodule or mass, consolidation: the opacity; zone the level of its lobe (upper, middle, lower lobe);
- cardiomegaly: the heart's outline; no side, no zone;
- devices (endotracheal tube, central line, pacemaker): the whole device, generator and lead for a pacemaker;
  side the line's route or the generator's side; no zone.

Only present findings have a region (a normal heart has none). The labels' seed is the film's geometry seed, as
for labelled_phantom(labels.seed, labels=labels); a film drawn with another seed has other regions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medgemma_xray.grounding.boxes import FilmBox
from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels

ZONES = ("upper", "middle", "lower")
# The name a radiologist gives each finding, as asked in the localisation prompt ("Where is the <name>?") and
# written as a box's label (with the side in front where there is one).
OBJECT_NAMES = {
    "pleural_effusion": "pleural effusion",
    "cardiomegaly": "enlarged heart",
    "pneumothorax": "pneumothorax",
    "nodule_or_mass": "nodule or mass",
    "consolidation": "consolidation",
    "endotracheal_tube": "endotracheal tube",
    "central_line": "central venous line",
    "pacemaker": "pacemaker",
}


@dataclass(frozen=True)
class Region:
    """One finding's ground-truth box on the film. side is the patient's ("right", "left") or None; zone is one
    of ZONES or None for findings without one (the heart, devices)."""

    finding: str
    side: str | None
    zone: str | None
    box: FilmBox


def object_name(finding: str) -> str:
    """The finding's name as the localisation prompt asks for it ('pleural effusion')."""
    if finding not in OBJECT_NAMES:
        raise ValueError(f"unknown finding {finding!r}; choose from {', '.join(FINDINGS)}")
    return OBJECT_NAMES[finding]


def box_label(finding: str, side: str | None) -> str:
    """The label a box carries: the object's name, with the patient's side first where it has one."""
    name = object_name(finding)
    return f"{side} {name}" if side else name


def _zone(finding: str, labels: PhantomLabels) -> str | None:
    if finding == "pleural_effusion":
        return "lower"
    if finding == "pneumothorax":
        return "upper"
    lobe = {"nodule_or_mass": labels.nodule, "consolidation": labels.consolidation}.get(finding)
    if lobe is None:
        return None
    return lobe.lobe.split()[1]  # "right middle lobe" -> "middle"


def mask_box(mask: np.ndarray, label: str) -> FilmBox | None:
    """The bounding box of a mask's pixels as film fractions (pixel edges, so a one-pixel mask has area), or None
    for an empty mask."""
    rows, cols = mask.shape
    hit_rows = np.flatnonzero(mask.any(axis=1))
    hit_cols = np.flatnonzero(mask.any(axis=0))
    if hit_rows.size == 0:
        return None
    return FilmBox(
        label=label,
        y0=float(hit_rows[0] / rows),
        x0=float(hit_cols[0] / cols),
        y1=float((hit_rows[-1] + 1) / rows),
        x1=float((hit_cols[-1] + 1) / cols),
    )


def regions_of(marks, labels: PhantomLabels) -> tuple[Region, ...]:
    """Regions from the marks draw_film recorded, in FINDINGS order (right before left within a finding)."""
    order = {name: index for index, name in enumerate(FINDINGS)}
    found = []
    for mark in marks:
        label = box_label(mark.finding, mark.side)
        if mark.finding == "nodule_or_mass" and labels.nodule is not None:
            label = f"{mark.side} {labels.nodule.kind}"  # what it is, as the report names it: "right mass"
        box = mask_box(mark.mask, label)
        if box is not None:
            found.append(Region(mark.finding, mark.side, _zone(mark.finding, labels), box))
    return tuple(sorted(found, key=lambda r: (order[r.finding], r.side != "right")))


def finding_regions(labels: PhantomLabels, rows: int, cols: int) -> tuple[Region, ...]:
    """Every present finding's region on the rows x cols film of labelled_phantom(labels.seed, rows, cols, labels)."""
    from medgemma_xray.phantoms.labelled import draw_film

    if rows < 16 or cols < 16:
        raise ValueError(f"a phantom film needs at least 16 x 16 pixels; got {rows} x {cols}")
    return regions_of(draw_film(labels.seed, rows, cols, labels).marks, labels)


def phantom_with_regions(seed: int, rows: int = 512, cols: int | None = None, labels: PhantomLabels | None = None):
    """(LabelledPhantom, regions) from one drawing: what labelled_phantom returns, and its findings' regions."""
    from medgemma_xray.phantoms.findings import sample_labels
    from medgemma_xray.phantoms.labelled import draw_film, expose

    labels = sample_labels(seed) if labels is None else labels
    drawn = draw_film(seed, rows, cols, labels)
    return expose(drawn, labels), regions_of(drawn.marks, labels)
