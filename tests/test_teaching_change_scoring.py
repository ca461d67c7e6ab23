"""The student's "what changed" read scored against a pair's change key (teaching/change_scoring.py): exact marks
for each rule in the module's docstring."""

from __future__ import annotations

import pytest

from medgemma_xray.teaching.change_scoring import ChangeMark, change_key_of, score_changes

KEY = {"pleural_effusion": "grew", "central_line": "removed", "pacemaker": "unchanged"}


def test_a_read_that_names_every_change_scores_them_all():
    score = score_changes({"pleural_effusion": "grew", "central_line": "removed"}, KEY)
    assert score.summary() == "3/3" and score.missed() == ()


def test_exact_marks_for_a_wrong_kind_a_missed_change_and_a_change_that_is_not_there():
    read = {"pleural_effusion": "shrank", "nodule_or_mass": "appeared", "cardiomegaly": "unchanged", "pneumothorax": ""}
    score = score_changes(read, KEY)
    assert score.marks == (
        ChangeMark("pleural_effusion", "grew", "shrank", False),
        ChangeMark("cardiomegaly", "unchanged", "unchanged", True),  # said unchanged, and the key lists no change
        ChangeMark("nodule_or_mass", "unchanged", "appeared", False),  # a change that is not in the key
        ChangeMark("central_line", "removed", None, False),  # missed: not stated
        ChangeMark("pacemaker", "unchanged", None, True),  # not claiming a change to an unchanged finding is right
    )
    assert score.summary() == "2/5"
    assert score.missed() == ("pleural_effusion", "nodule_or_mass", "central_line")


def test_an_empty_read_misses_every_change():
    score = score_changes({}, KEY)
    assert (score.right, score.total) == (1, 3)
    assert score_changes({}, {}).summary() == "nothing to score"


def test_unknown_findings_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown findings \['heart'\]"):
        score_changes({"heart": "grew"}, KEY)


def test_a_change_key_from_pairs_or_objects():
    class Change:
        def __init__(self, finding, kind):
            self.finding, self.kind = finding, kind

    assert change_key_of([("pneumothorax", "appeared"), Change("central_line", "removed")]) == {
        "pneumothorax": "appeared",
        "central_line": "removed",
    }


def test_the_session_csv_and_pdf_carry_the_change_read_beside_the_models_statement():
    import csv
    import io
    import shutil
    import subprocess

    from medgemma_xray.teaching.session_export import CaseRecord, session_csv, session_pdf

    statement = "Compared with the prior: The right pleural effusion has grown, small to large."
    paired = CaseRecord(
        title="Phantom follow-up 01",
        change_key={"pleural_effusion": "grew"},
        change_read={"pleural_effusion": "grew", "pacemaker": "appeared"},
        change_statement=statement,
    )
    rows = list(csv.DictReader(io.StringIO(session_csv([paired, CaseRecord(title="Phantom case 01")]))))
    assert {k: rows[0][k] for k in ("changes_score", "changes (key)", "changes (student)", "what changed (model)")} == {
        "changes_score": "1/2",
        "changes (key)": "pleural effusion grew",
        "changes (student)": "pleural effusion grew (right); pacemaker appeared (WRONG)",
        "what changed (model)": statement,
    }
    assert all(rows[1][k] == "" for k in ("changes_score", "changes (key)", "changes (student)"))  # no prior
    if not shutil.which("pdftotext"):
        pytest.skip("poppler-utils (pdftotext) not installed: setup_env.sh --dev")
    text = subprocess.run(["pdftotext", "-", "-"], input=session_pdf([paired]), capture_output=True, check=True).stdout
    words = " ".join(text.decode().split())
    assert "What changed since the prior: student 1/2" in words and "appeared (WRONG)" in words
    assert "The model on what changed: Compared with the prior" in words
