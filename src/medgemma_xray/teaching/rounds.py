"""One browser session of a teaching round: the case on screen (its film, view, key and conversation) and the
record of every case so far. Immutable values: each UI handler returns a new session (Gradio keeps it per tab).

No file name enters a session: a library case is named by its title, an upload "Uploaded film N". The names of
uploaded files and the films' DICOM identifiers are kept only in `forbidden`, for scrubbing the exports.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from medgemma_xray.intake import IntakeFilm
from medgemma_xray.phantoms.findings import PhantomLabels
from medgemma_xray.teaching.library import LibraryCase, shuffled
from medgemma_xray.teaching.marks import Pointing
from medgemma_xray.teaching.prior_round import PriorView
from medgemma_xray.teaching.session_export import CaseRecord
from medgemma_xray.teaching.viewer import DisplayFilm, ViewState
from medgemma_xray.xray_io import Radiograph

# Cases one session keeps for its export. Each record holds a PNG thumbnail (about 25 KiB) and the case's text, and
# a session lives as long as its tab (or SESSION_TTL_S after an API client's last call): without a bound, a client
# that uploads and asks in a loop grew the server by a record per question (the one-hour soak's teaching user, 380
# records). A round of a hundred cases is far beyond a class; beyond it the oldest go, and the export says so.
MAX_SESSION_CASES = 100


@dataclass(frozen=True)
class Round:
    """The case on screen."""

    title: str
    history: str
    film: Radiograph  # a small copy of the film (source, warnings, view position), never its full pixels
    display: DisplayFilm  # the viewer's overview; the full-resolution values stay in the intake's cache
    model_image: object  # the PIL image the model reads
    view: ViewState
    image_key: str | None = None  # the model image's content hash (GenerationRequest.image_key)
    warnings: tuple[str, ...] = ()  # the loader's and the film check's, shown in the case's notes
    key: PhantomLabels | None = None
    teaching_points: tuple[str, ...] = ()
    comparison: str = ""
    student_read: dict | None = None
    student_notes: str = ""
    model_report: str = ""
    model_read: dict | None = None
    revealed: bool = False
    questions: tuple[tuple[str, str], ...] = ()
    asked_before_reveal: int = 0  # questions answered while the case was not yet revealed
    conversation_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    prior: PriorView | None = None  # an earlier film of the same patient, shown beside this one
    change_read: dict[str, str] | None = None  # the student's "what changed" read, committed at the reveal
    pointing: Pointing = field(default_factory=Pointing)  # the student's marks and the model's boxes

    def key_regions(self):
        """Where the key puts its findings on this film (teaching.pointing), or None where it does not say."""
        from medgemma_xray.teaching.pointing import key_regions

        return key_regions(self.key, self.display.shape)

    def record(self) -> CaseRecord:
        from medgemma_xray.teaching.viewer import thumbnail_png

        return CaseRecord(
            title=self.title,
            history=self.history,
            student_read=self.student_read,
            student_notes=self.student_notes,
            model_read=self.model_read,
            model_report=self.model_report,
            key=self.key,
            questions=self.questions,
            teaching_points=self.teaching_points,
            asked_before_reveal=self.asked_before_reveal,
            thumbnail=thumbnail_png(self.display),
            change_key=self.prior.change_key if self.prior is not None else None,
            change_read=self.change_read,
            change_statement=self.prior.statement if self.prior is not None else "",
            pointing=self.pointing,
            regions=self.pointing.key_regions,
        )


@dataclass(frozen=True)
class TeachingSession:
    current: Round | None = None
    records: tuple[CaseRecord, ...] = ()
    record_index: int | None = None  # where the current round's record sits in `records` (None: not yet)
    order: tuple[str, ...] = ()  # case ids in quiz order
    uploads: int = 0
    forbidden: frozenset[str] = frozenset()
    dropped: int = 0  # records let go from the front (MAX_SESSION_CASES): the first kept is case dropped + 1

    def with_round(self, round_: Round, forbidden: set[str] | frozenset[str] = frozenset()) -> TeachingSession:
        return replace(self, current=round_, record_index=None, forbidden=self.forbidden | frozenset(forbidden))

    def updated(self, round_: Round) -> TeachingSession:
        """The current round changed: keep its record (once revealed or asked about) in step."""
        session = replace(self, current=round_)
        if not (round_.revealed or round_.questions):
            return session
        records = list(self.records)
        if self.record_index is None:
            records.append(round_.record())
            over = max(0, len(records) - MAX_SESSION_CASES)
            records = records[over:]
            return replace(session, records=tuple(records), record_index=len(records) - 1, dropped=self.dropped + over)
        records[self.record_index] = round_.record()
        return replace(session, records=tuple(records))

    def shuffled_order(self, case_ids: list[str], seed: int | None = None) -> TeachingSession:
        return replace(self, order=tuple(shuffled(case_ids, seed)))

    def next_case_id(self) -> str | None:
        """The case after the current one in quiz order (the first when none is open or it is not in the order)."""
        if not self.order:
            return None
        title_order = list(self.order)
        current = getattr(self.current, "case_id", None)
        if current in title_order:
            index = title_order.index(current) + 1
            return title_order[index] if index < len(title_order) else None
        return title_order[0]


@dataclass(frozen=True)
class LibraryRound(Round):
    case_id: str = ""


def round_of(title: str, film: IntakeFilm, display: DisplayFilm) -> Round:
    """A round on an uploaded film (no history, no key until the teacher loads one)."""
    return Round(
        title=title,
        history="",
        film=film.film,
        display=display,
        model_image=film.model_image,
        view=ViewState.initial(display),
        image_key=film.image_key,
        warnings=film.warnings,
    )


def library_round(case: LibraryCase, film: IntakeFilm, display: DisplayFilm) -> LibraryRound:
    return LibraryRound(
        title=case.title,
        history=case.history,
        film=film.film,
        display=display,
        model_image=film.model_image,
        view=ViewState.initial(display),
        image_key=film.image_key,
        warnings=film.warnings,
        key=case.key,
        teaching_points=case.teaching_points,
        comparison=case.comparison,
        case_id=case.case_id,
    )


def upload_names(path: str | Path) -> set[str]:
    """An uploaded file's name and stem, to scrub from exports (Gradio may prefix or keep the original name)."""
    name = Path(path).name
    return {name, Path(name).stem}
