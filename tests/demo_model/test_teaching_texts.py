"""The demo model's training texts: answers agree with the labels, reports follow medgemma_xray.assistant.report_schema exactly."""

from __future__ import annotations

import numpy as np

from medgemma_xray.assistant.report_schema import REPORT_FIELDS, REPORT_PROMPT
from medgemma_xray.demo_model import teaching
from medgemma_xray.phantoms.evaluation import parse_yes_no
from medgemma_xray.phantoms.findings import FINDINGS, sample_labels
from medgemma_xray.phantoms.questions import FINDING_QUESTIONS

LABELS = [sample_labels(seed) for seed in range(300)]


def test_every_finding_answer_says_yes_exactly_when_the_finding_is_present():
    for labels in LABELS:
        for finding in FINDINGS:
            answer = teaching.finding_answer(finding, labels)
            assert parse_yes_no(answer) is labels.present(finding), (finding, answer, labels)


def test_answers_name_the_side_and_size_the_labels_give():
    for labels in LABELS:
        if labels.effusion is None:
            continue
        answer = teaching.finding_answer("pleural_effusion", labels)
        assert labels.effusion.size in answer
        if labels.effusion.side == "both":
            assert "bilateral" in answer
        else:
            other = {"left": "right", "right": "left"}[labels.effusion.side]
            assert labels.effusion.side in answer and other not in answer
    ratios = {labels.heart.cardiothoracic_ratio: teaching.finding_answer("cardiomegaly", labels) for labels in LABELS}
    assert all(f"{round(r * 20) / 20:.2f}" in answer for r, answer in ratios.items())


def test_structured_report_is_one_label_line_per_schema_field_in_order():
    for labels in LABELS:
        lines = teaching.structured_report(labels).split("\n")
        assert len(lines) == len(REPORT_FIELDS)
        for line, field in zip(lines, REPORT_FIELDS, strict=True):
            assert line.startswith(f"{field.label}: ") and len(line) > len(field.label) + 3, line
    report = teaching.structured_report(next(label for label in LABELS if label.effusion and label.heart.enlarged))
    pleura = report.split("\n")[[f.key for f in REPORT_FIELDS].index("pleura")]
    assert "pleural effusion" in pleura
    assert "cardiomegaly" in report.split("\n")[-1].lower()


def test_a_film_without_findings_reads_normal():
    normal = next(labels for labels in LABELS if labels.pathology_free and not labels.heart.enlarged)
    assert teaching.impression_text(normal) == "No acute cardiopulmonary abnormality."
    assert teaching.lungs_text(normal) == "Clear lungs."


def test_training_pairs_ask_each_finding_once_and_include_the_report_prompt():
    rng = np.random.default_rng(0)
    labels = LABELS[0]
    pairs = teaching.question_answer_pairs(labels, rng)
    asked = [
        next(f for f, qs in FINDING_QUESTIONS.items() if q in qs)
        for q, _ in pairs[:]
        if q not in teaching.TECHNIQUE_QUESTIONS
    ]
    assert sorted(asked) == sorted(FINDINGS)
    assert teaching.overview_pairs(labels, rng)[0] == (REPORT_PROMPT, teaching.structured_report(labels))
    canonical = [questions[0] for questions in FINDING_QUESTIONS.values()]
    assert len(set(canonical)) == len(FINDINGS) and "Is there a pleural effusion?" in canonical
