"""The student's "what changed since the prior?" read, scored finding by finding against the pair's change key.

A change read maps a finding (phantoms.findings.FINDINGS) to a change kind (the vocabulary of
phantoms.progression: grew, shrank, appeared, removed, inserted; and "unchanged"); a finding left out, or set
to "", is a change the student did not claim. A change key is the pair's list of changes (finding, kind).

Which findings count, exactly:
- every finding the key lists: right when the read names the same kind; not naming it is "not stated" and
  wrong (a change the student missed), except where the key's kind is "unchanged" (not claiming a change is
  right);
- every finding the read names that the key does not list: the key says it did not change, so right only when
  the read says "unchanged" (anything else is a change the student saw that is not there).
The score is right/total over those findings, in the order of FINDINGS. Nothing is "not assessed": a change read
is a list of what changed, so what it leaves out is a claim that nothing else did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from medgemma_xray.phantoms.findings import FINDINGS

UNCHANGED = "unchanged"


def change_kinds() -> tuple[str, ...]:
    """The kinds a change read offers: phantoms.progression's change vocabulary, and "unchanged" (the answer for a
    finding the reader looked at and saw no change in; progression never lists it as a change)."""
    from medgemma_xray.phantoms.progression import CHANGE_KINDS

    return (*CHANGE_KINDS, UNCHANGED)


def model_changes(statement: str) -> dict[str, str] | None:
    """The changes a model's "what changed" answer states, finding -> kind (progression's parser, after any
    thinking trace); {} for "no interval change"; None when the answer states neither."""
    from medgemma_xray.grounding.prompts import strip_thinking
    from medgemma_xray.phantoms.progression import parse_change_statement

    found = parse_change_statement(strip_thinking(statement))
    return None if found is None else dict(sorted(found))


@dataclass(frozen=True)
class ChangeMark:
    finding: str
    key: str  # the key's kind ("unchanged" where the key does not list the finding)
    read: str | None  # the student's kind; None: not stated
    right: bool

    @property
    def label(self) -> str:
        return self.finding.replace("_", " ")


@dataclass(frozen=True)
class ChangeScore:
    marks: tuple[ChangeMark, ...]

    @property
    def right(self) -> int:
        return sum(mark.right for mark in self.marks)

    @property
    def total(self) -> int:
        return len(self.marks)

    def summary(self) -> str:
        """e.g. "2/3"; "nothing to score" for a key with no change and a read that claims none."""
        return f"{self.right}/{self.total}" if self.total else "nothing to score"

    def missed(self) -> tuple[str, ...]:
        """The findings the read got wrong, in FINDINGS order."""
        return tuple(mark.finding for mark in self.marks if not mark.right)


def change_key_of(changes: Iterable[object]) -> dict[str, str]:
    """A change key as a mapping finding -> kind, from the pair's changes (objects with .finding and .kind, or
    (finding, kind) pairs)."""
    key: dict[str, str] = {}
    for change in changes:
        finding, kind = change if isinstance(change, tuple) else (change.finding, change.kind)  # type: ignore[attr-defined]
        key[str(finding)] = str(kind)
    return key


def score_changes(read: Mapping[str, str | None], key: Mapping[str, str]) -> ChangeScore:
    """Mark a change read against a change key (see the module docstring for the rules). Raises ValueError for a
    finding that is not one of FINDINGS (in either), naming it and the valid ones."""
    unknown = sorted((set(read) | set(key)) - set(FINDINGS))
    if unknown:
        raise ValueError(f"unknown findings {unknown} in a change read or key; the findings are {', '.join(FINDINGS)}")
    marks = []
    for finding in FINDINGS:
        claimed = read.get(finding) or None
        if finding not in key and claimed is None:
            continue
        expected = key.get(finding, UNCHANGED)
        right = (claimed or UNCHANGED) == expected
        marks.append(ChangeMark(finding, expected, claimed, right))
    return ChangeScore(tuple(marks))


def change_text(kind: str | None) -> str:
    """A kind as the tables show it ("not stated" for None)."""
    return kind if kind else "not stated"
