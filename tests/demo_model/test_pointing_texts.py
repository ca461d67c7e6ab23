"""The demo model's localisation and comparison texts: the boxes it learns are the regions, in the model's frame."""

from __future__ import annotations

import numpy as np

from medgemma_xray.demo_model.pointing import comparison_turn, localisation_answer, localisation_turns
from medgemma_xray.grounding.boxes import iou, parse_boxes
from medgemma_xray.grounding.prompts import COMPARISON_PROMPT, localisation_prompt
from medgemma_xray.phantoms.findings import FINDINGS
from medgemma_xray.phantoms.progression import parse_change_statement, progression_pair
from medgemma_xray.phantoms.regions import object_name, phantom_with_regions


def test_each_answer_reasons_then_gives_the_regions_boxes_in_the_model_frame():
    checked = set()
    for seed in range(12):
        phantom, regions = phantom_with_regions(seed)
        rows, cols = phantom.film.shape
        for finding in FINDINGS:
            answer = localisation_answer(finding, phantom.labels, regions, rows, cols)
            reasoning, final = answer.split("\n")
            assert final.startswith("Final Answer: [") and reasoning.endswith(".")
            boxes = parse_boxes(answer, rows, cols)
            truth = [r for r in regions if r.finding == finding]
            assert not boxes.refused and len(boxes.boxes) == len(truth)
            for region, box in zip(truth, boxes.boxes, strict=True):
                # Back through the padded square's 0..1000 grid: within its rounding of the film's region.
                assert iou(region.box, box) > 0.97 and box.label == region.box.label
            if not truth:
                assert final == "Final Answer: []" and "nothing to locate" in reasoning
            checked.add((finding, bool(truth)))
    assert {finding for finding, present in checked if present} == set(FINDINGS)


def test_localisation_turns_ask_the_notebooks_prompt_mostly_about_what_the_film_shows():
    rng = np.random.default_rng(0)
    asked_present = asked = 0
    for seed in range(8):
        phantom, regions = phantom_with_regions(seed)
        for question, answer in localisation_turns(phantom.labels, regions, *phantom.film.shape, rng):
            finding = next(f for f in FINDINGS if question == localisation_prompt(object_name(f)))
            asked += 1
            asked_present += phantom.labels.present(finding)
            assert (answer.endswith("[]")) != phantom.labels.present(finding)
    assert 0.5 < asked_present / asked < 1.0


def test_the_comparison_answer_is_the_pairs_key():
    for seed in range(6):
        pair = progression_pair(seed)
        question, answer = comparison_turn(pair.changes)
        assert question == COMPARISON_PROMPT
        assert parse_change_statement(answer) == {(c.finding, c.kind) for c in pair.changes}
