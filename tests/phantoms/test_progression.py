"""Progression pairs: the same patient on two days, differing only where the stated change is."""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.phantoms.labelled import draw_film
from medgemma_xray.phantoms.progression import (
    CHANGE_KINDS,
    NO_CHANGE,
    PAIR_KINDS,
    change_statement,
    pair_kind,
    parse_change_statement,
    progression_pair,
)
from medgemma_xray.phantoms.regions import finding_regions


def boxes_mask(regions, shape) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    for region in regions:
        left, top, right, bottom = region.box.pixels(*shape)
        mask[top:bottom, left:right] = True
    return mask


@pytest.mark.parametrize("kind", PAIR_KINDS)
def test_the_two_films_differ_only_inside_the_changed_findings_regions(kind):
    for seed in (3, 17):
        pair = progression_pair(seed, kind)
        prior, current = pair.prior.labels, pair.current.labels
        assert prior.seed == current.seed == seed and prior.technique == current.technique
        shape = pair.prior.film.shape
        assert pair.current.film.shape == shape
        # Noise-free, the anatomy is the same pixel for pixel outside the change.
        changed = np.abs(draw_film(seed, *shape, prior).film - draw_film(seed, *shape, current).film) > 0
        findings = {change.finding for change in pair.changes}
        assert {c.kind for c in pair.changes} <= set(CHANGE_KINDS)
        if kind == "unchanged":
            assert not changed.any() and prior == current and pair.changes == ()
            assert not np.array_equal(pair.prior.film, pair.current.film)  # another day's exposure
            continue
        assert changed.any(), (seed, kind)
        regions = [
            r for r in finding_regions(prior, *shape) + finding_regions(current, *shape) if r.finding in findings
        ]
        assert not (changed & ~boxes_mask(regions, shape)).any(), (seed, kind)


def test_each_kind_changes_what_it_says():
    for seed in range(16):
        pair = progression_pair(seed)
        prior, current = pair.prior.labels, pair.current.labels
        (change,) = pair.changes or (None,)
        if pair.kind.startswith("effusion"):
            order = ("small", "moderate", "large")
            grew = order.index(current.effusion.size) > order.index(prior.effusion.size)
            assert grew == (change.kind == "grew") and prior.effusion.side == current.effusion.side
        elif pair.kind == "nodule_appeared":
            assert prior.nodule is None and current.nodule is not None
        elif pair.kind == "device_removed":
            assert prior.present(change.finding) and not current.present(change.finding)
        elif pair.kind == "device_inserted":
            assert not prior.present(change.finding) and current.present(change.finding)
    assert {pair_kind(seed) for seed in range(60)} == set(PAIR_KINDS)
    assert all(progression_pair(seed).kind == pair_kind(seed) for seed in range(3))


def test_statements_round_trip_and_other_wordings_parse():
    for seed in range(12):
        pair = progression_pair(seed)
        expected = frozenset((c.finding, c.kind) for c in pair.changes)
        assert parse_change_statement(change_statement(pair.changes)) == expected
    assert change_statement(()) == NO_CHANGE
    assert parse_change_statement("No change since the prior film.") == frozenset()
    assert parse_change_statement("The left effusion is larger; a new nodule in the right upper lobe.") == {
        ("pleural_effusion", "grew"),
        ("nodule_or_mass", "appeared"),
    }
    assert parse_change_statement("Both films show a chest.") is None


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown pair kind"):
        progression_pair(0, "fracture_healed")
