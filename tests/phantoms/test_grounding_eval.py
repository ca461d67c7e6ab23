"""Localisation and change-detection scoring: a perfect answer scores 1, a wrong one 0, and the real backend is
asked with the notebook's prompts (the prior and the current film in one request)."""

from __future__ import annotations

import json

import pytest

from medgemma_xray.demo_model.pointing import localisation_answer
from medgemma_xray.grounding.boxes import final_answer
from medgemma_xray.phantoms.findings import FINDINGS
from medgemma_xray.phantoms.grounding_eval import (
    change_detection_accuracy,
    format_change_table,
    format_localisation_table,
    grounding_phantoms,
    held_out_pairs,
    localisation_accuracy,
    score_change_answer,
    score_localisation_answer,
    summarise_changes,
    summarise_localisation,
)
from medgemma_xray.phantoms.progression import NO_CHANGE, change_statement, progression_pair


@pytest.fixture(scope="module")
def phantoms():
    return grounding_phantoms(4, start_seed=0)


def test_the_key_scores_iou_one_and_a_box_elsewhere_scores_zero(phantoms):
    perfect, wrong = [], []
    for phantom in phantoms:
        for finding in FINDINGS:
            key = localisation_answer(finding, phantom.labels, phantom.regions, phantom.rows, phantom.cols)
            perfect.append(score_localisation_answer(phantom, finding, key))
            far = final_answer([("elsewhere", [0, 0, 5, 5])])  # a corner of the padded square
            wrong.append(score_localisation_answer(phantom, finding, far))
    good = summarise_localisation(perfect, FINDINGS, len(phantoms))
    bad = summarise_localisation(wrong, FINDINGS, len(phantoms))
    assert good["overall"]["regions"] == sum(len(p.regions) for p in phantoms) > 0
    assert good["overall"]["mean_iou"] > 0.97 and good["overall"]["hit_rate_0.5"] == 1.0
    assert bad["overall"]["mean_iou"] == 0.0 and bad["overall"]["hit_rate_0.3"] == 0.0
    for finding, row in good["per_finding"].items():
        if row["absent_asked"]:
            assert row["absent_empty_rate"] == 1.0, finding  # the key says [] when it is not there
    assert all(row["absent_empty_rate"] in (None, 0.0) for row in bad["per_finding"].values())
    unparsed = summarise_localisation(
        [score_localisation_answer(phantoms[0], phantoms[0].regions[0].finding, "It is somewhere.")], FINDINGS, 1
    )
    assert unparsed["overall"]["mean_iou"] == 0.0
    assert unparsed["per_finding"][phantoms[0].regions[0].finding]["unparsed"] == 1
    table = format_localisation_table(good)
    assert all(f"| {finding} |" in table for finding in FINDINGS) and "| **all** |" in table


def test_change_answers_are_right_only_when_they_state_exactly_the_pairs_changes():
    pairs = held_out_pairs(6, start_seed=0)
    answers = []
    for pair in pairs:
        key = change_statement(progression_pair(int(pair.name.split("-")[1])).changes)
        answers.append(score_change_answer(pair, key))
        answers.append(score_change_answer(pair, "The films look like chest films."))
        other = NO_CHANGE if pair.changes else "Compared with the prior: The pacemaker has been removed."
        answers.append(score_change_answer(pair, other))
    result = summarise_changes(answers)
    assert result["accuracy"] == pytest.approx(1 / 3) and result["unparsed"] == len(pairs)
    assert format_change_table(result).splitlines()[-1].startswith(f"| **all** | {3 * len(pairs)} |")


def test_held_out_seeds_only():
    with pytest.raises(ValueError, match="held-out seeds"):
        grounding_phantoms(2, start_seed=999_999)
    with pytest.raises(ValueError, match="held-out seeds"):
        held_out_pairs(1, start_seed=1_000_000)


def test_the_real_backend_is_asked_where_and_what_changed_with_both_films(demo_model_dir, phantoms):
    """Through the serving PyTorch backend: every answer is recorded and scored, whatever the checkpoint says."""
    from medgemma_xray.pytorch_backend.eager import TorchInference

    backend = TorchInference(demo_model_dir, device="cpu")
    try:
        where = localisation_accuracy(backend, phantoms[:1], findings=FINDINGS[:2], max_new_tokens=24)
        changed = change_detection_accuracy(backend, held_out_pairs(1, start_seed=3), max_new_tokens=16)
    finally:
        backend.close()
    assert len(where["answers"]) == 2 and all(isinstance(a["answer"], str) for a in where["answers"])
    assert changed["pairs"] == 1 and changed["answers"][0]["answer"]
    json.dumps(where) and json.dumps(changed)  # the benchmark writes them as JSON
