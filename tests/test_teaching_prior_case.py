"""A library case's prior film (teaching/prior_case.py, docs/teaching_cases.md): the starter set's follow-up
cases load with their prior and change key; a broken prior is refused with every problem named, and the rest of
the library still loads."""

from __future__ import annotations

import json

import pytest

from medgemma_xray.phantoms.progression import CHANGE_KINDS, progression_pair
from medgemma_xray.teaching.library import SIDECAR_SUFFIX, load_library, write_starter_set
from medgemma_xray.teaching.starter_pairs import PAIR_SEED


@pytest.fixture(scope="module")
def library_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pairs")
    write_starter_set(folder, 2, pairs=3)
    return folder


def test_the_starter_pairs_carry_their_prior_key_and_changes(library_folder):
    library = load_library(library_folder)
    assert library.problems == ()
    follow_ups = [case for case in library.cases if case.prior is not None]
    assert [case.title for case in follow_ups] == [f"Phantom follow-up {n:02d}" for n in (1, 2, 3)]
    for number, case in enumerate(follow_ups):
        pair = progression_pair(PAIR_SEED + number)
        prior = case.prior
        assert prior.film_path.is_file() and prior.film_path.parent == case.film_path.parent
        assert prior.film_path.suffix == case.film_path.suffix  # one format: the same window shows both alike
        assert prior.key == pair.prior.labels and case.key == pair.current.labels
        assert [(c.finding, c.kind) for c in prior.changes] == [(c.finding, c.kind) for c in pair.changes]
        assert prior.interval.endswith("earlier")
        assert all(c.kind in CHANGE_KINDS for c in prior.changes)
    assert [case.prior for case in library.cases if case.title.startswith("Phantom case")] == [None, None]


def _broken(library_folder, tmp_path, prior: object):
    folder = tmp_path / "broken"
    folder.mkdir()
    for path in library_folder.glob("phantom_pair_950000*"):
        (folder / path.name).write_bytes(path.read_bytes())
    sidecar = next(folder.glob(f"*{SIDECAR_SUFFIX}"))
    record = json.loads(sidecar.read_text())
    record["prior"] = prior
    sidecar.write_text(json.dumps(record))
    return load_library(folder)


def test_a_prior_with_every_kind_of_problem_is_refused_listing_each(library_folder, tmp_path):
    library = _broken(
        library_folder,
        tmp_path,
        {
            "film": "missing.png",
            "interval": 3,
            "key": {"heart": {"cardiothoracic_ratio": 2.0}},
            "changes": [{"finding": "heart", "kind": "exploded", "text": "x"}, "grew"],
            "date": "2020-01-01",
        },
    )
    assert library.cases == ()
    (problem,) = library.problems
    for expected in (
        "prior.date: not a prior field",
        "prior.film: no such file in the case's folder",
        "prior.interval: missing or empty",
        "prior.key.",
        "prior.changes[1].finding: found 'heart'",
        "prior.changes[1].kind: found 'exploded'; expected one of: " + ", ".join(CHANGE_KINDS),
        "prior.changes[2]: expected an object with exactly finding, kind, text",
    ):
        assert expected in problem, (expected, problem)


@pytest.mark.parametrize(
    ("film", "message"),
    [
        ("../escape.png", "a plain file name"),
        ("notes.txt", "expected a film"),
        ("phantom_pair_950000.png", "the case's own film"),
    ],
)
def test_a_prior_film_outside_the_folder_or_not_a_film_is_refused(library_folder, tmp_path, film, message):
    assert PAIR_SEED % 2 == 0  # the first pair's films are PNG
    library = _broken(library_folder, tmp_path, {"film": film, "interval": "1 year earlier"})
    assert message in library.problems[0]


def test_a_prior_that_is_not_an_object_is_refused(library_folder, tmp_path):
    assert "prior: expected an object" in _broken(library_folder, tmp_path, "yesterday.png").problems[0]
