"""Task-accuracy arithmetic: F1 with unparsed answers, ECE, confidence, and the macro-F1 gate."""

from __future__ import annotations

import math

import pytest

from medgemma_xray.phantoms.evaluation import (
    HELD_OUT_SEED_LIMIT,
    answer_confidence,
    compare_task_accuracy,
    expected_calibration_error,
    f1_counts,
    format_table,
    held_out_phantoms,
    parse_yes_no,
    summarise,
)
from medgemma_xray.phantoms.findings import FINDINGS


def test_yes_no_is_read_from_the_first_word_only():
    assert parse_yes_no("Yes, a small left pleural effusion.") is True
    assert parse_yes_no("  no pleural effusion.") is False
    assert parse_yes_no("No, the heart size is normal.") is False
    assert parse_yes_no("Nodule in the right upper lobe.") is None  # "No" must be a whole word
    assert parse_yes_no("There is no effusion, yes.") is None
    assert parse_yes_no("") is None


def test_f1_counts_an_unparsed_answer_as_wrong_either_way():
    truth = [True, True, True, False, False, False]
    predicted = [True, False, None, True, False, None]
    counts = f1_counts(truth, predicted)
    assert (counts["tp"], counts["fn"], counts["fp"], counts["tn"]) == (1, 2, 2, 1)
    assert counts["precision"] == pytest.approx(1 / 3) and counts["recall"] == pytest.approx(1 / 3)
    assert counts["f1"] == pytest.approx(2 * 1 / (2 * 1 + 2 + 2))
    assert counts["unparsed"] == 2 and counts["support"] == 3
    assert f1_counts([False, False], [False, False])["f1"] == 1.0  # nothing to find, nothing claimed
    assert f1_counts([False, False], [True, False])["f1"] == 0.0


def test_confidence_is_the_geometric_mean_token_probability():
    assert answer_confidence([math.log(0.5), math.log(0.8)]) == pytest.approx(math.sqrt(0.4))
    assert answer_confidence([]) is None and answer_confidence(None) is None


def test_expected_calibration_error():
    # Overconfident: always 0.9 sure, right half the time -> ECE 0.4.
    assert expected_calibration_error([0.9] * 10, [True, False] * 5) == pytest.approx(0.4)
    # Calibrated per bin: 0.25 right a quarter of the time, 0.75 three quarters -> 0.
    confidences = [0.25] * 4 + [0.75] * 4
    correct = [True, False, False, False, True, True, True, False]
    assert expected_calibration_error(confidences, correct) == pytest.approx(0.0)
    # Bins weigh by their share: 0.95 x3 all right (gap 0.05), 0.55 x1 wrong (gap 0.55).
    assert expected_calibration_error([0.95, 0.95, 0.95, 0.55], [True, True, True, False]) == pytest.approx(
        0.75 * 0.05 + 0.25 * 0.55
    )
    assert expected_calibration_error([1.0], [True]) == pytest.approx(0.0)  # 1.0 falls in the top bin
    with pytest.raises(ValueError, match="confidences"):
        expected_calibration_error([1.2], [True])
    with pytest.raises(ValueError, match="2 confidences but 1"):
        expected_calibration_error([0.5, 0.5], [True])


def answers_for(f1_target: dict[str, list[tuple[bool, bool | None]]], confidence: float | None = 0.8):
    rows = []
    for finding, pairs in f1_target.items():
        for index, (truth, predicted) in enumerate(pairs):
            rows.append(
                {
                    "phantom": f"p{index}",
                    "finding": finding,
                    "truth": truth,
                    "predicted": predicted,
                    "correct": predicted == truth,
                    "confidence": confidence,
                }
            )
    return rows


def test_macro_f1_gate_fails_past_the_allowed_drop_and_names_the_worst_findings():
    perfect = {f: [(True, True), (False, False), (True, True), (False, False)] for f in FINDINGS}
    reference = summarise(answers_for(perfect), FINDINGS, 4)
    assert reference["macro_f1"] == 1.0 and reference["ece"] == pytest.approx(0.2)
    one_miss = dict(perfect, pneumothorax=[(True, False), (False, False), (True, True), (False, False)])
    candidate = summarise(answers_for(one_miss), FINDINGS, 4)
    drop = reference["macro_f1"] - candidate["macro_f1"]
    assert drop == pytest.approx((1 - 2 / 3) / len(FINDINGS))  # F1 2/3 on one finding of eight
    failures = compare_task_accuracy(reference, candidate, max_drop=0.01)
    assert len(failures) == 1 and "pneumothorax -33.3" in failures[0] and "4.2 points" in failures[0]
    assert compare_task_accuracy(reference, candidate, max_drop=0.05) == []
    assert compare_task_accuracy(reference, reference) == []
    fewer = summarise(answers_for({f: pairs[:2] for f, pairs in perfect.items()}), FINDINGS, 2)
    assert "phantom counts differ" in compare_task_accuracy(reference, fewer)[0]


def test_ece_is_left_out_when_the_backend_gives_no_log_probabilities():
    result = summarise(answers_for({"pleural_effusion": [(True, True)]}, confidence=None), ["pleural_effusion"], 1)
    assert result["ece"] is None and result["macro_f1"] == 1.0


def test_table_lists_every_finding_and_the_macro_f1():
    result = summarise(answers_for({f: [(True, True), (False, True)] for f in FINDINGS}), FINDINGS, 2)
    table = format_table({"pytorch": result, "int8": result})
    assert table.count("\n") == len(FINDINGS) + 3
    assert "| pleural_effusion | 1/2 | 66.7 | 66.7 |" in table and "**66.7**" in table


def test_held_out_phantoms_stay_below_the_training_seeds():
    phantoms = held_out_phantoms(2, start_seed=10)
    assert [p.name for p in phantoms] == ["phantom-000010", "phantom-000011"]
    assert phantoms[0].image.mode == "RGB" and phantoms[0].image.size[0] == phantoms[0].image.size[1]
    with pytest.raises(ValueError, match="held-out seeds"):
        held_out_phantoms(2, start_seed=HELD_OUT_SEED_LIMIT - 1)
