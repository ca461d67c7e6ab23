"""medgemma_xray.teaching.keys and medgemma_xray.teaching.library: a teacher's key in the phantom label schema, refused with every problem
named; the case library, its starter set, and the shuffle."""

from __future__ import annotations

import json

import pytest

from medgemma_xray.phantoms.findings import FINDINGS, sample_labels
from medgemma_xray.teaching.keys import AnswerKeyError, key_from_json, key_from_record, validate_key
from medgemma_xray.teaching.library import load_library, shuffled, write_starter_set
from medgemma_xray.teaching.scoring import read_from_labels


def _record(seed: int = 0) -> dict:
    return json.loads(sample_labels(seed).to_json())


def test_a_phantom_sidecar_is_a_valid_key():
    for seed in range(50):
        labels = sample_labels(seed)
        key = key_from_json(labels.to_json())
        assert read_from_labels(key) == read_from_labels(labels)


def test_a_teachers_key_needs_no_seed_or_notice():
    record = _record(3)
    for name in ("seed", "synthetic", "labels_version"):
        record.pop(name)
    key = key_from_record(record)
    assert key.synthetic == "teacher's key" and read_from_labels(key) == read_from_labels(sample_labels(3))


def test_every_problem_is_listed_with_where_and_what_is_allowed():
    record = _record(0)
    record["heart"] = {"cardiothoracic_ratio": "0.55"}
    record["technique"]["inspiration"] = "deep"
    record["effusion"] = {"side": "middle", "size": "moderate", "loculated": True}
    record["pacemaker"] = "left"
    record["fracture"] = None
    record["central_line"] = {"route": "left subclavian"}
    problems = validate_key(record)
    text = "\n".join(problems)
    assert "heart.cardiothoracic_ratio: found '0.55'; expected a number between 0.2 and 0.9" in text
    assert "technique.inspiration: found 'deep'; expected one of: adequate, poor" in text
    assert "effusion.side: found 'middle'; expected one of: right, left, both" in text
    assert "effusion.loculated: not an attribute of effusion" in text
    assert "pacemaker: found 'left'; expected null (absent) or an object with side" in text
    assert "fracture: not a field of the key" in text
    assert "central_line.tip: missing" in text
    assert len(problems) == 7
    with pytest.raises(AnswerKeyError) as error:
        key_from_record(record, "Case 4's key")
    message = str(error.value)
    assert message.startswith("Case 4's key does not follow the answer-key schema")
    assert all(problem in message for problem in problems) and "Fix these fields" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "is not valid JSON (line 1, column 2"),
        (b"\xff\xfe", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object, found list"),
        ('{"technique": {"rotated": false, "inspiration": "adequate", "exposure": "adequate"}}', "heart: missing"),
        ('{"labels_version": 2}', "labels_version: found 2; this code reads version 1"),
        (json.dumps({**_record(1), "heart": {"cardiothoracic_ratio": 1.5}}), "found 1.5; expected a number between"),
        (json.dumps({**_record(1), "seed": "x"}), "seed: found 'x'; expected a whole number"),
    ],
)
def test_bad_key_files_get_clear_messages(text, expected):
    with pytest.raises(AnswerKeyError) as error:
        key_from_json(text, "The key file")
    assert expected in str(error.value)
    assert "Traceback" not in str(error.value)


def test_the_starter_library_loads_with_keys_equal_to_the_labels(tmp_path):
    films = write_starter_set(tmp_path, 4)
    library = load_library(tmp_path)
    assert library.problems == ()
    assert [case.title for case in library.cases] == [f"Phantom case {n:02d}" for n in range(1, 5)]
    for case in library.cases:
        seed = int(case.case_id.rsplit("_", 1)[1])
        assert read_from_labels(case.key) == read_from_labels(sample_labels(seed))
        assert case.history and case.teaching_points and case.film_path in films
    assert {f.suffix for f in films} == {".png", ".dcm"}


def test_a_broken_case_is_listed_and_the_rest_still_load(tmp_path):
    write_starter_set(tmp_path, 3)
    sidecar = sorted(tmp_path.glob("*.case.json"))[1]
    record = json.loads(sidecar.read_text())
    record["key"]["pneumothorax"] = {"side": "up", "size": "small"}
    record["history"] = ""
    sidecar.write_text(json.dumps(record))
    (tmp_path / "lonely.case.json").write_text("{}")
    library = load_library(tmp_path)
    assert len(library.cases) == 2
    problems = "\n".join(library.problems)
    assert "history: missing or empty" in problems and "pneumothorax.side: found 'up'" in problems
    assert "a sidecar without a film beside it" in problems
    assert "phantom_case_" not in problems and "lonely" not in problems  # cases are never named by file


def test_shuffle_is_a_permutation_and_repeats_with_a_seed():
    ids = [f"case-{n}" for n in range(12)]
    order = shuffled(ids, seed=7)
    assert sorted(order) == sorted(ids) and order != ids and shuffled(ids, seed=7) == order


def test_starter_histories_fit_their_findings():
    """Ages drawn from who has such a film (not 25, 26, 27 ... in order), each history ending with the clinical
    question the film was taken to answer."""
    import re

    from medgemma_xray.phantoms.labelled import labelled_phantom
    from medgemma_xray.teaching.library import STARTER_SEED, history_line

    ages = []
    for seed in range(STARTER_SEED, STARTER_SEED + 120):
        labels = labelled_phantom(seed, 64).labels
        history = history_line(labels, seed)
        age = int(re.match(r"(\d+)-year-old (man|woman): ", history).group(1))
        ages.append(age)
        assert re.search(r"\. Clinical question: [^.]+\?$", history), history
        if labels.pacemaker is not None or labels.heart.enlarged:
            assert age >= 60, history
        if labels.nodule is not None and labels.central_line is None and labels.endotracheal_tube is None:
            assert age >= 55, history
        only_pneumothorax = [f for f in FINDINGS if labels.present(f)] == ["pneumothorax"]
        if only_pneumothorax:
            assert age <= 34 and f"sudden {labels.pneumothorax.side}-sided pleuritic" in history, history
        if labels.central_line is not None and labels.pneumothorax is not None:
            assert "after a" in history and "central line insertion" in history and "pneumothorax?" in history
    steps = {b - a for a, b in zip(ages, ages[1:], strict=False)}
    assert steps != {1}, "ages step by one from case to case"
