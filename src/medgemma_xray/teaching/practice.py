"""Spaced repetition of each student's missed findings: an SM-2 schedule per finding per student, kept in one local
JSON file that the teacher can delete, and the "Practise my misses" round built from it.

The schedule is SM-2 (Wozniak 1990), as Anki and SuperMemo's successors use it: a card has an ease factor
(2.5 to start, never below 1.3), an interval in days and a count of successful repetitions. A review of quality q
(0-5) moves the ease by 0.1 - (5 - q) * (0.08 + (5 - q) * 0.02); q >= 3 grows the interval (1 day, then 6, then
the interval times the ease the card had before this review, rounded); q < 3 starts the card over. SM-2 repeats a card graded below 4 in the same
session until it is recalled, so a miss is due again today (its interval is 1 day from the next recall).
A finding missed on Reveal is reviewed with MISSED (1); a finding whose card is due and that the student gets
right is reviewed with RECALLED (4).

The file (PracticeMemory) holds, per student name as typed (the empty name for a student who gave none), per
finding, its card: nothing else, no case, no film, no date other than the due day. It is written atomically
with mode 0600 and never leaves the machine. A file that is not valid, or larger than MAX_BYTES, is refused with
a message that says how to fix it (the teacher deletes it); it is never overwritten then.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from medgemma_xray.phantoms.findings import FINDINGS

MEMORY_FORMAT = 1
MEMORY_FILE = "teaching-practice.json"
MAX_BYTES = 1 << 20  # a student with every finding is about 1 kB: a thousand students fit
MAX_NAME = 80
START_EASE = 2.5
MIN_EASE = 1.3
MISSED = 1  # SM-2's "incorrect response; the correct one remembered"
RECALLED = 4  # "correct response after a hesitation"
ROUND_SIZE = 5


class PracticeMemoryError(ValueError):
    """The practice memory file cannot be used; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Card:
    """One finding's schedule for one student."""

    due: datetime.date
    ease: float = START_EASE
    interval_days: int = 0
    repetitions: int = 0  # successful reviews in a row
    lapses: int = 0  # misses so far

    def is_due(self, today: datetime.date) -> bool:
        return self.due <= today


def review(card: Card | None, quality: int, today: datetime.date) -> Card:
    """The card after one review of the given quality (0-5) on `today` (SM-2; a new card for None)."""
    if not 0 <= quality <= 5:
        raise ValueError(f"an SM-2 quality is 0 to 5; found {quality}")
    card = card or Card(due=today)
    ease = max(MIN_EASE, card.ease + 0.1 - (5 - quality) * (0.08 + (5 - quality) * 0.02))
    if quality < 3:
        return Card(due=today, ease=ease, interval_days=1, repetitions=0, lapses=card.lapses + 1)
    if card.repetitions == 0:
        interval = 1
    elif card.repetitions == 1:
        interval = 6
    else:
        interval = max(1, round(card.interval_days * card.ease))
    return replace(
        card,
        due=today + datetime.timedelta(days=interval),
        ease=ease,
        interval_days=interval,
        repetitions=card.repetitions + 1,
    )


def student_key(name: str | None) -> str:
    """The name as the memory keys it: its words joined by one space, at most MAX_NAME characters ("" for none)."""
    return " ".join((name or "").split())[:MAX_NAME]


Cards = dict[str, Card]  # finding -> card


def reviewed(cards: Mapping[str, Card], missed: Iterable[str], right: Iterable[str], today: datetime.date) -> Cards:
    """One revealed case's effect on a student's cards: each missed finding reviewed as MISSED (a card made if
    needed); each finding got right whose card is due reviewed as RECALLED (one never missed gets no card, and
    one not yet due keeps its schedule: seeing it right early does not space it out further)."""
    updated = dict(cards)
    missed = set(missed)
    for finding in missed:
        updated[finding] = review(updated.get(finding), MISSED, today)
    for finding in set(right) - missed:
        if finding in updated and updated[finding].is_due(today):  # one not yet due keeps its schedule
            updated[finding] = review(updated[finding], RECALLED, today)
    return updated


def due_findings(cards: Mapping[str, Card], today: datetime.date) -> tuple[str, ...]:
    """The findings due on `today`, the most overdue first (then the lowest ease, then FINDINGS order)."""
    due = [f for f, card in cards.items() if card.is_due(today)]
    order = {f: i for i, f in enumerate(FINDINGS)}
    return tuple(sorted(due, key=lambda f: (cards[f].due, cards[f].ease, order.get(f, len(order)))))


# --- the round --------------------------------------------------------------------------------------------------


def practice_case_ids(
    due: Sequence[str], cases: Sequence[tuple[str, frozenset[str]]], seen: Iterable[str], size: int = ROUND_SIZE
) -> list[str]:
    """The case ids of a practice round: cases that show the due findings (each case as (id, the findings it
    shows)). Cases not yet seen first, the ones showing more due findings first, then in the given order; a seen
    case only for a due finding that no unseen case shows. At most `size`."""
    seen = set(seen)
    wanted = set(due)

    def coverage(case: tuple[str, frozenset[str]]) -> int:
        return len(case[1] & wanted)

    showing = [case for case in cases if coverage(case)]
    fresh = sorted((c for c in showing if c[0] not in seen), key=coverage, reverse=True)  # stable: given order
    chosen = [case_id for case_id, _ in fresh[:size]]
    covered = set().union(*(shown for case_id, shown in fresh[:size])) if fresh else set()
    for case_id, shown in showing:
        if len(chosen) >= size:
            break
        if case_id in seen and shown & (wanted - covered):
            chosen.append(case_id)
            covered |= shown
    return chosen


# --- the file ---------------------------------------------------------------------------------------------------


def _card_from(record: object, where: str, problems: list[str]) -> Card | None:
    if not isinstance(record, dict) or set(record) != {"due", "ease", "interval_days", "repetitions", "lapses"}:
        problems.append(f"{where}: expected an object with due, ease, interval_days, repetitions, lapses")
        return None
    try:
        due = datetime.date.fromisoformat(record["due"])
    except (TypeError, ValueError):
        problems.append(f"{where}.due: expected a date (YYYY-MM-DD)")
        return None
    ease, interval, repetitions, lapses = (record[k] for k in ("ease", "interval_days", "repetitions", "lapses"))
    numbers_ok = (
        isinstance(ease, int | float)
        and not isinstance(ease, bool)
        and MIN_EASE <= ease <= 10
        and all(type(n) is int and 0 <= n <= 100_000 for n in (interval, repetitions, lapses))
    )
    if not numbers_ok:
        problems.append(f"{where}: ease 1.3-10 and whole numbers of days, repetitions and lapses expected")
        return None
    return Card(due=due, ease=float(ease), interval_days=interval, repetitions=repetitions, lapses=lapses)


def memory_from_json(text: str) -> dict[str, Cards]:
    """The students' cards from the file's text; raises PracticeMemoryError naming every problem."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PracticeMemoryError(f"it is not JSON ({exc.msg} at line {exc.lineno})") from exc
    if (
        not isinstance(record, dict)
        or record.get("format") != MEMORY_FORMAT
        or not isinstance(record.get("students"), dict)
    ):
        raise PracticeMemoryError(f'expected {{"format": {MEMORY_FORMAT}, "students": {{...}}}}')
    problems: list[str] = []
    students: dict[str, Cards] = {}
    for name, cards in record["students"].items():
        where = "a student's entry"
        if name != student_key(name) or not isinstance(cards, dict):
            problems.append(f"{where}: a name of at most {MAX_NAME} characters, with an object of findings")
            continue
        kept: Cards = {}
        for finding, card in cards.items():
            if finding not in FINDINGS:
                problems.append(f"{where}: {finding!r} is not a finding ({', '.join(FINDINGS)})")
                continue
            parsed = _card_from(card, f"{where}.{finding}", problems)
            if parsed is not None:
                kept[finding] = parsed
        students[name] = kept
    if problems:
        raise PracticeMemoryError(
            "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if problems[5:] else "")
        )
    return students


def memory_to_json(students: Mapping[str, Mapping[str, Card]]) -> str:
    def card_record(card: Card) -> dict:
        return {
            "due": card.due.isoformat(),
            "ease": round(card.ease, 4),
            "interval_days": card.interval_days,
            "repetitions": card.repetitions,
            "lapses": card.lapses,
        }

    record = {
        "format": MEMORY_FORMAT,
        "students": {name: {f: card_record(c) for f, c in cards.items()} for name, cards in sorted(students.items())},
    }
    return json.dumps(record, indent=1, sort_keys=False) + "\n"


class PracticeMemory:
    """The one practice file of a server (<LOG_DIR>/teaching-practice.json): read and written under a lock, each
    write atomic (a temporary file, then a rename) with mode 0600."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _refusal(self, what: str) -> PracticeMemoryError:
        return PracticeMemoryError(
            f"The practice memory ({self.path.name} in the server's log folder) {what}. Nothing was remembered. "
            f"The teacher can delete {self.path.name} to start it afresh (every student's misses are then forgotten)."
        )

    def _read(self) -> dict[str, Cards]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return {}
        if size > self.max_bytes:
            raise self._refusal(f"is {size} bytes, over its limit of {self.max_bytes}")
        try:
            text = self.path.read_bytes()[: self.max_bytes + 1].decode("utf-8")
            return memory_from_json(text)
        except UnicodeDecodeError as exc:
            raise self._refusal("is not UTF-8 text") from exc
        except PracticeMemoryError as exc:
            raise self._refusal(f"is not valid: {exc}") from exc

    def _write(self, students: Mapping[str, Mapping[str, Card]]) -> None:
        text = memory_to_json(students).encode("utf-8")
        if len(text) > self.max_bytes:
            raise self._refusal(f"would grow over its limit of {self.max_bytes} bytes")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def cards(self, name: str | None) -> Cards:
        """This student's cards (empty for a student never seen)."""
        with self._lock:
            return dict(self._read().get(student_key(name), {}))

    def record_reveal(
        self, name: str | None, missed: Iterable[str], right: Iterable[str], today: datetime.date
    ) -> Cards:
        """Remember one revealed case for this student (see reviewed); returns their cards. A case with nothing
        missed and nothing to review writes nothing."""
        missed, right = list(missed), list(right)
        with self._lock:
            students = self._read()
            key = student_key(name)
            before = students.get(key, {})
            after = reviewed(before, missed, right, today)
            if after != before:
                students[key] = after
                self._write(students)
            return after
