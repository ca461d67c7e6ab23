"""medgemma_xray.teaching.scoring and medgemma_xray.teaching.model_read: every read field marked against the labels, exactly."""

from __future__ import annotations

import pytest

from medgemma_xray.demo_model.teaching import structured_report
from medgemma_xray.phantoms.findings import FINDINGS, sample_labels
from medgemma_xray.teaching.model_read import model_read
from medgemma_xray.teaching.scoring import (
    NODULE_SIZE_TOLERANCE_CM,
    READ_FIELDS,
    TOLERANCES,
    read_from_labels,
    score_read,
)

ALWAYS_SCORED = [name for name, (finding, _) in READ_FIELDS.items() if finding is None]
WRONG_VALUES = {  # a value that differs from any key's, per field kind
    "effusion.side": {"right": "left", "left": "both", "both": "right"},
    "effusion.size": {"small": "large", "moderate": "small", "large": "moderate"},
    "pneumothorax.side": {"right": "left", "left": "right"},
    "pneumothorax.size": {"small": "large", "large": "small"},
    "central_line.route": {"right internal jugular": "left subclavian", "left subclavian": "right internal jugular"},
    "central_line.tip": {
        "superior vena cava": "right atrium",
        "cavoatrial junction": "right atrium",
        "right atrium": "cavoatrial junction",
    },
    "pacemaker.side": {"left": "right", "right": "left"},
    "technique.inspiration": {"adequate": "poor", "poor": "adequate"},
    "technique.exposure": {"adequate": "under", "under": "over", "over": "adequate"},
}


def _key_with(field: str):
    """The labels of the first seed whose key scores `field`."""
    finding = READ_FIELDS[field][0]
    for seed in range(2000):
        labels = sample_labels(seed)
        if finding is None or labels.present(finding):
            return labels
    raise AssertionError(f"no seed below 2000 has {finding}")


def _wrong(field: str, value):
    if isinstance(value, bool):
        return not value
    if field in TOLERANCES:
        return round(value + 2 * TOLERANCES[field], 2)
    if field.endswith(".lobe"):
        return "left upper lobe" if value != "left upper lobe" else "right lower lobe"
    return WRONG_VALUES[field][value]


def test_the_key_as_a_read_scores_every_field_right():
    for seed in range(200):
        labels = sample_labels(seed)
        score = score_read(read_from_labels(labels), labels)
        present = [f for f in FINDINGS if labels.present(f)]
        attributes = [n for n, (f, _) in READ_FIELDS.items() if f in present]
        assert score.right == score.total == len(ALWAYS_SCORED) + len(attributes)


@pytest.mark.parametrize("field", list(READ_FIELDS))
def test_each_field_is_marked_on_its_own(field):
    labels = _key_with(field)
    read = read_from_labels(labels)
    read[field] = _wrong(field, read[field])
    score = score_read(read, labels)
    assert [m.field for m in score.marks if not m.right] == [field]
    read.pop(field)  # not stated is wrong too
    assert [m.field for m in score_read(read, labels).marks if not m.right] == [field]


@pytest.mark.parametrize("field", list(TOLERANCES))
def test_numbers_match_within_their_tolerance_only(field):
    labels = _key_with(field)
    read = read_from_labels(labels)
    key_value = read[field]
    read[field] = key_value + TOLERANCES[field] * 0.9
    assert score_read(read, labels).mark(field).right
    read[field] = key_value + TOLERANCES[field] * 1.1
    assert not score_read(read, labels).mark(field).right


def test_the_attributes_the_model_gets_wrong_are_marked_wrong():
    labels = _key_with("central_line.tip")
    read = read_from_labels(labels)
    read["cardiothoracic_ratio"] = 0.55
    labels_ctr = labels.heart.cardiothoracic_ratio
    assert abs(labels_ctr - 0.55) > 0.03  # the key's ratio is not 0.55 here
    read["central_line.tip"] = "right atrium" if labels.central_line.tip != "right atrium" else "cavoatrial junction"
    wrong = {m.field for m in score_read(read, labels).marks if not m.right}
    assert wrong == {"cardiothoracic_ratio", "central_line.tip"}
    nodule_key = _key_with("nodule.size_cm")
    from dataclasses import replace

    nodule_key = replace(nodule_key, nodule=replace(nodule_key.nodule, size_cm=2.5))
    read = read_from_labels(nodule_key)
    read["nodule.size_cm"] = 3.0  # "3 cm mass" for a 2.5 cm nodule
    assert not score_read(read, nodule_key).mark("nodule.size_cm").right


def test_attributes_count_only_where_the_key_has_the_finding():
    labels = next(sample_labels(s) for s in range(100) if sample_labels(s).effusion is None)
    read = read_from_labels(labels)
    read.update({"present.pleural_effusion": True, "effusion.side": "left", "effusion.size": "small"})
    score = score_read(read, labels)
    assert score.mark("effusion.side") is None and not score.mark("present.pleural_effusion").right


def test_an_unknown_read_field_is_refused():
    with pytest.raises(ValueError, match="unknown read fields"):
        score_read({"present.fracture": True}, sample_labels(0))


def test_the_model_read_of_the_trained_report_differs_only_where_the_report_rounds():
    """The demo model's trained text says every label but the nodule size, which it rounds to whole cm."""
    for seed in range(300):
        labels = sample_labels(seed)
        score = score_read(model_read(structured_report(labels)), labels)
        wrong = [m for m in score.marks if not m.right]
        for mark in wrong:
            assert mark.field == "nodule.size_cm", (seed, mark)
            assert abs(mark.read - mark.key) > NODULE_SIZE_TOLERANCE_CM


def test_the_model_read_of_free_text_a_real_model_writes():
    text = (
        "**Technique:** Rotated; poor inspiration; underexposed.\n"
        "**Lungs:** A 2.5 cm nodule in the right upper lobe. No consolidation.\n"
        "**Pleura:** Small left pleural effusion. No pneumothorax.\n"
        "**Heart and mediastinum:** Cardiomegaly, cardiothoracic ratio 0.58.\n"
        "**Lines and devices:** Right internal jugular central line with its tip in the right atrium.\n"
        "**Impression:** Nodule; effusion; cardiomegaly."
    )
    read = model_read(text)
    assert read["technique.rotated"] is True and read["technique.inspiration"] == "poor"
    assert read["technique.exposure"] == "under"
    assert read["nodule.size_cm"] == 2.5 and read["nodule.lobe"] == "right upper lobe"
    assert read["present.consolidation"] is False and read["present.pneumothorax"] is False
    assert (read["effusion.side"], read["effusion.size"]) == ("left", "small")
    assert read["present.cardiomegaly"] is True and read["cardiothoracic_ratio"] == 0.58
    assert read["central_line.route"] == "right internal jugular" and read["central_line.tip"] == "right atrium"
    assert "present.pacemaker" in read and read["present.pacemaker"] is False
    assert "technique.rotated" not in model_read("Lungs: Clear lungs.")  # a region not written is not stated


def test_a_student_is_scored_only_on_the_fields_answered():
    """An empty read of a normal film scores nothing (not 8/12 for the absent findings it never called), and
    every field left empty is shown as not assessed; the model's read is still scored on every field."""
    normal = next(labels for labels in map(sample_labels, range(2000)) if not any(map(labels.present, FINDINGS)))
    empty = score_read({}, normal, answered_only=True)
    assert (empty.right, empty.total, empty.not_assessed) == (0, 0, len(ALWAYS_SCORED))
    assert empty.summary() == f"nothing answered ({len(ALWAYS_SCORED)} not assessed)"
    assert score_read({}, normal).summary() == f"0/{len(ALWAYS_SCORED)}"  # the model's rule: unstated is wrong
    partial = score_read({"present.pleural_effusion": False, "cardiothoracic_ratio": 0.9}, normal, answered_only=True)
    assert partial.summary() == f"1/2 ({len(ALWAYS_SCORED) - 2} not assessed)"
    assert not partial.mark("technique.exposure").assessed and partial.mark("cardiothoracic_ratio").assessed
