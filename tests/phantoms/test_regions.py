"""Ground-truth regions: each finding's box covers what the generator drew for it, and only about that much."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from medgemma_xray.grounding.boxes import iou
from medgemma_xray.phantoms.findings import FINDINGS, Heart, PhantomLabels, sample_labels
from medgemma_xray.phantoms.labelled import draw_film, labelled_phantom
from medgemma_xray.phantoms.regions import ZONES, finding_regions, mask_box, object_name, phantom_with_regions

ROWS, COLS = 512, 448
FIELD = {
    "pleural_effusion": "effusion",
    "pneumothorax": "pneumothorax",
    "nodule_or_mass": "nodule",
    "consolidation": "consolidation",
    "endotracheal_tube": "endotracheal_tube",
    "central_line": "central_line",
    "pacemaker": "pacemaker",
}


def with_and_without(labels: PhantomLabels, finding: str) -> tuple[PhantomLabels, PhantomLabels]:
    """Labels with only `finding` (as `labels` has it), and with nothing: the same patient otherwise. A tiny heart
    stands for 'without' cardiomegaly, so the difference is the enlarged heart itself."""
    bare = PhantomLabels(seed=labels.seed, heart=Heart(0.42), technique=labels.technique)
    if finding == "cardiomegaly":
        return dataclasses.replace(bare, heart=labels.heart), dataclasses.replace(bare, heart=Heart(0.05))
    return dataclasses.replace(bare, **{FIELD[finding]: getattr(labels, FIELD[finding])}), bare


def covered(regions, shape) -> np.ndarray:
    cover = np.zeros(shape, dtype=bool)
    for region in regions:
        left, top, right, bottom = region.box.pixels(*shape)
        cover[top:bottom, left:right] = True
    return cover


def test_each_findings_box_covers_the_pixels_drawing_it_changed_and_is_tight():
    seen = set()
    for seed in range(40):
        labels = sample_labels(seed)
        for finding in FINDINGS:
            if not labels.present(finding):
                continue
            seen.add(finding)
            present, absent = with_and_without(labels, finding)
            changed = np.abs(draw_film(seed, ROWS, COLS, present).film - draw_film(seed, ROWS, COLS, absent).film) > 0
            regions = [r for r in finding_regions(present, ROWS, COLS) if r.finding == finding]
            assert regions, (seed, finding)
            cover = covered(regions, changed.shape)
            assert not (changed & ~cover).any(), (seed, finding, int((changed & ~cover).sum()))
            # Tight: the box of what changed nearly fills the regions' box (the heart hides a little of a lung
            # finding drawn behind it, so not exactly).
            assert iou(mask_box(cover, "regions"), mask_box(changed, "changed")) > 0.8, (seed, finding)
    assert seen == set(FINDINGS)


def test_regions_are_the_present_findings_on_the_labelled_side_and_zone():
    for seed in range(60):
        labels = sample_labels(seed)
        regions = finding_regions(labels, ROWS, COLS)
        assert {r.finding for r in regions} == {f for f in FINDINGS if labels.present(f)}
        for region in regions:
            assert region.zone is None or region.zone in ZONES
            assert object_name(region.finding) in region.box.label or region.finding == "nodule_or_mass"
            if region.side is not None and region.finding not in ("central_line", "pacemaker"):
                # PA film: the patient's right is on the viewer's left.
                assert (region.box.centre[1] < 0.5) == (region.side == "right"), (seed, region)
        if labels.effusion is not None:
            sides = {r.side for r in regions if r.finding == "pleural_effusion"}
            assert sides == set(labels.effusion.sides)
        if labels.nodule is not None:
            (nodule,) = [r for r in regions if r.finding == "nodule_or_mass"]
            assert nodule.zone == labels.nodule.lobe.split()[1]
            assert nodule.box.label == f"{nodule.side} {labels.nodule.kind}"


def test_regions_match_the_rendered_phantom_at_any_size():
    phantom, regions = phantom_with_regions(5)
    assert np.array_equal(phantom.film, labelled_phantom(5).film)
    assert regions == finding_regions(phantom.labels, *phantom.film.shape)
    small = finding_regions(phantom.labels, 256, phantom.film.shape[1] // 2)
    assert [r.finding for r in small] == [r.finding for r in regions]
    assert all(iou(a.box, b.box) > 0.9 for a, b in zip(small, regions, strict=True))


def test_bad_sizes_and_names_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="at least 16"):
        finding_regions(sample_labels(0), 8, 8)
    with pytest.raises(ValueError, match="unknown finding"):
        object_name("fracture")
