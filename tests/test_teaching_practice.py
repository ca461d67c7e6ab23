"""Spaced repetition of a student's missed findings (teaching/practice.py): SM-2's exact numbers, its properties
over any sequence of reviews, the round it builds, and the memory file's rules (0600, atomic, bounded, a corrupt
or oversized file refused and never overwritten)."""

from __future__ import annotations

import datetime
import json
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medgemma_xray.phantoms.findings import FINDINGS
from medgemma_xray.teaching.practice import (
    MIN_EASE,
    Card,
    PracticeMemory,
    PracticeMemoryError,
    due_findings,
    memory_from_json,
    memory_to_json,
    practice_case_ids,
    review,
    reviewed,
    student_key,
)

DAY = datetime.date(2026, 12, 3)


def days(n: int) -> datetime.date:
    return DAY + datetime.timedelta(days=n)


def test_a_first_miss_is_due_today_with_the_ease_sm2_gives_quality_1():
    card = review(None, 1, DAY)
    # ease 2.5 + 0.1 - 4 * (0.08 + 4 * 0.02) = 2.5 - 0.54
    assert card == Card(due=DAY, ease=pytest.approx(1.96), interval_days=1, repetitions=0, lapses=1)


def test_recalls_after_a_miss_space_out_1_then_6_then_interval_times_ease():
    card = review(None, 1, DAY)
    first = review(card, 4, DAY)  # quality 4 leaves the ease as it is
    assert (first.due, first.interval_days, first.repetitions, first.ease) == (days(1), 1, 1, pytest.approx(1.96))
    second = review(first, 4, days(1))
    assert (second.due, second.interval_days, second.repetitions) == (days(7), 6, 2)
    third = review(second, 4, days(7))
    assert (third.interval_days, third.due) == (12, days(19))  # round(6 * 1.96) = 12
    fifth = review(review(third, 5, days(19)), 5, days(43))
    assert fifth.ease == pytest.approx(2.16)  # two fives: +0.1 each
    lapsed = review(fifth, 0, days(90))
    # quality 0: 2.16 + 0.1 - 5 * (0.08 + 5 * 0.02) = 1.36; starts over, due the same day
    assert (lapsed.due, lapsed.interval_days, lapsed.repetitions, lapsed.lapses) == (days(90), 1, 0, 2)
    assert lapsed.ease == pytest.approx(1.36)
    assert review(lapsed, 1, days(90)).ease == MIN_EASE  # never below 1.3


def test_review_refuses_a_quality_outside_0_to_5():
    with pytest.raises(ValueError, match="0 to 5"):
        review(None, 6, DAY)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=30))
def test_sm2_properties_over_any_reviews(qualities):
    card, today = None, DAY
    for quality in qualities:
        before = card
        card = review(card, quality, today)
        assert MIN_EASE <= card.ease <= 2.5 + 0.1 * len(qualities) + 1e-9
        if quality < 3:
            assert card.due == today and card.repetitions == 0 and card.interval_days == 1
            assert card.lapses == (before.lapses if before else 0) + 1
        else:
            assert card.due > today and card.repetitions == (before.repetitions if before else 0) + 1
            if before is not None and before.repetitions >= 2:
                assert card.interval_days >= before.interval_days  # the interval never shrinks on a recall
        today = card.due


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=90),
        st.dictionaries(
            st.sampled_from(FINDINGS),
            st.builds(
                Card,
                due=st.dates(datetime.date(2000, 1, 1), datetime.date(2100, 1, 1)),
                ease=st.floats(MIN_EASE, 5.0).map(lambda e: round(e, 4)),
                interval_days=st.integers(0, 3650),
                repetitions=st.integers(0, 100),
                lapses=st.integers(0, 100),
            ),
        ),
    )
)
def test_the_memory_file_round_trips_any_cards(students):
    keyed = {student_key(name): cards for name, cards in students.items()}
    assert memory_from_json(memory_to_json(keyed)) == keyed


def test_reviewed_cards_only_for_misses_and_for_findings_already_missed():
    cards = reviewed({}, missed=["pleural_effusion"], right=["cardiomegaly"], today=DAY)
    assert set(cards) == {"pleural_effusion"}  # a finding never missed gets no card
    cards = reviewed(cards, missed=["pneumothorax"], right=["pleural_effusion", "cardiomegaly"], today=DAY)
    assert set(cards) == {"pleural_effusion", "pneumothorax"}
    assert cards["pleural_effusion"].due == days(1) and cards["pneumothorax"].due == DAY
    assert due_findings(cards, DAY) == ("pneumothorax",)
    assert due_findings(cards, days(1)) == ("pneumothorax", "pleural_effusion")  # the most overdue first
    early = reviewed(cards, missed=[], right=["pleural_effusion"], today=DAY)  # right again, before it is due
    assert early["pleural_effusion"] == cards["pleural_effusion"]


def test_a_practice_round_prefers_unseen_cases_that_show_the_due_findings():
    cases = [
        ("a", frozenset({"pleural_effusion"})),
        ("b", frozenset({"cardiomegaly"})),
        ("c", frozenset({"pleural_effusion", "pneumothorax"})),
        ("d", frozenset({"pneumothorax"})),
        ("e", frozenset({"nodule_or_mass"})),
    ]
    due = ["pleural_effusion", "pneumothorax", "nodule_or_mass"]
    assert practice_case_ids(due, cases, seen=["c"]) == ["a", "d", "e"]
    assert practice_case_ids(due, cases, seen=[]) == ["c", "a", "d", "e"]
    assert practice_case_ids(due, cases, seen=[], size=2) == ["c", "a"]
    # the only case with the nodule was seen: it comes back, after the unseen ones
    assert practice_case_ids(due, cases, seen=["e"]) == ["c", "a", "d", "e"]
    assert practice_case_ids(["consolidation"], cases, seen=[]) == []


def test_the_memory_file_is_0600_keyed_by_the_typed_name_and_holds_nothing_else(tmp_path):
    memory = PracticeMemory(tmp_path / "teaching-practice.json")
    assert memory.cards("Ana  Lopez") == {}
    memory.record_reveal("  Ana  Lopez ", ["pleural_effusion"], [], DAY)
    assert stat.S_IMODE(memory.path.stat().st_mode) == 0o600
    record = json.loads(memory.path.read_text())
    assert record == {
        "format": 1,
        "students": {
            "Ana Lopez": {
                "pleural_effusion": {
                    "due": "2026-12-03",
                    "ease": 1.96,
                    "interval_days": 1,
                    "repetitions": 0,
                    "lapses": 1,
                }
            }
        },
    }
    assert memory.cards("Ana Lopez")["pleural_effusion"].lapses == 1
    assert memory.cards("Someone else") == {}
    assert list(tmp_path.iterdir()) == [memory.path]  # no temporary file left behind


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "is not valid: it is not JSON"),
        (b"\xff\xfe", "is not UTF-8"),
        (b'{"format": 2, "students": {}}', "is not valid"),
        (b'{"format": 1, "students": {"A": {"lungs": {}}}}', "'lungs' is not a finding"),
        (
            b'{"format": 1, "students": {"A": {"pneumothorax": {"due": "soon", "ease": 2.5, "interval_days": 1, '
            b'"repetitions": 0, "lapses": 1}}}}',
            "expected a date",
        ),
    ],
)
def test_a_corrupt_memory_file_is_refused_with_what_to_do_and_left_as_it_is(tmp_path, content, message):
    path = tmp_path / "teaching-practice.json"
    path.write_bytes(content)
    memory = PracticeMemory(path)
    for attempt in (lambda: memory.cards("A"), lambda: memory.record_reveal("A", ["pneumothorax"], [], DAY)):
        with pytest.raises(PracticeMemoryError, match=message) as refusal:
            attempt()
        assert "delete teaching-practice.json" in str(refusal.value)
    assert path.read_bytes() == content


def test_an_oversized_memory_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "teaching-practice.json"
    path.write_bytes(b" " * 2048)
    with pytest.raises(PracticeMemoryError, match="2048 bytes, over its limit of 1024"):
        PracticeMemory(path, max_bytes=1024).cards("A")


def test_a_memory_that_would_outgrow_its_limit_is_not_written(tmp_path):
    memory = PracticeMemory(tmp_path / "teaching-practice.json", max_bytes=400)
    memory.record_reveal("A", ["pneumothorax"], [], DAY)
    with pytest.raises(PracticeMemoryError, match="would grow over its limit"):
        memory.record_reveal("B", list(FINDINGS), [], DAY)
    assert set(json.loads(memory.path.read_text())["students"]) == {"A"}
