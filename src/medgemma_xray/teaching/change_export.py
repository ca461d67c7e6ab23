"""The "what changed since the prior" part of a session's exports (teaching/session_export.py): its CSV columns
and its section of the PDF handout, for a case that had a prior film. A case without one leaves the columns empty
and prints no section.
"""

from __future__ import annotations

from collections.abc import Mapping

from medgemma_xray.teaching.change_scoring import ChangeScore, change_text, score_changes

CHANGE_COLUMNS = ("changes_score", "changes (key)", "changes (student)", "what changed (model)")


def change_score(key: Mapping[str, str] | None, read: Mapping[str, str] | None) -> ChangeScore | None:
    """The student's change read scored, where the case had a change key and the student entered a read."""
    return score_changes(read, key) if key is not None and read is not None else None


def _listed(changes: Mapping[str, str]) -> str:
    return "; ".join(f"{finding.replace('_', ' ')} {kind}" for finding, kind in changes.items()) or "no change"


def change_cells(key: Mapping[str, str] | None, read: Mapping[str, str] | None, statement: str) -> dict[str, str]:
    """The case's CHANGE_COLUMNS cells (all empty for a case without a prior's change key or a model statement)."""
    score = change_score(key, read)
    claimed = {f: k for f, k in (read or {}).items() if k}
    return {
        "changes_score": score.summary() if score is not None else "",
        "changes (key)": _listed(key) if key is not None else "",
        "changes (student)": "; ".join(
            f"{m.label} {change_text(m.read)} ({'right' if m.right else 'WRONG'})" for m in score.marks
        )
        if score is not None
        else (_listed(claimed) if read is not None else ""),
        "what changed (model)": statement,
    }


def change_flowables(key: Mapping[str, str] | None, read: Mapping[str, str] | None, statement: str, para, mm, colors):
    """The handout's section for the case: a table of each scored finding (key, student) and the model's
    statement; [] for a case without a change key or a statement."""
    from reportlab.platypus import Table, TableStyle

    score = change_score(key, read)
    story = []
    if score is not None:
        rows = [[para("Since the prior"), para("Key"), para("Student")]]
        rows += [[para(m.label), para(m.key), para(f"{change_text(m.read)} ({'right' if m.right else 'WRONG'})")]
                 for m in score.marks]  # fmt: skip
        table = Table(rows, colWidths=[45 * mm, 35 * mm, 45 * mm], repeatRows=1)
        table.setStyle(
            TableStyle(
                [
                    ("FONTSIZE", (0, 0), (-1, -1), 8),
                    ("BACKGROUND", (0, 0), (-1, 0), colors.lightgrey),
                    ("GRID", (0, 0), (-1, -1), 0.25, colors.grey),
                ]
            )
        )
        story += [para(f"What changed since the prior: student {score.summary()}"), table]
    elif key is not None:
        story.append(para(f"What changed since the prior (key): {_listed(key)}"))
    if statement:
        story.append(para(f"The model on what changed: {statement}"))
    return story
