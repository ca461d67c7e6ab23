"""What the /teaching page's handler modules share (web.teaching_page, _view, _answers, _exports): the page's
context, the session as its State holds it, and the read form's names.

A session's State holds one SessionSlot (web.page_session) of a TeachingSession; a handler that needs the case on
screen asks current_round(values), which refuses with a message when none is open.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medgemma_xray.phantoms.findings import FINDINGS
from medgemma_xray.teaching.practice import MEMORY_FILE, PracticeMemory
from medgemma_xray.teaching.rounds import Round, TeachingSession
from medgemma_xray.web.page_errors import refused
from medgemma_xray.web.page_session import SessionSlot

if TYPE_CHECKING:
    from medgemma_xray.intake import FilmIntake
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.asking import Asking
    from medgemma_xray.web.upload_cache import UploadInbox

logger = logging.getLogger("teaching_ui")  # the log name operators know

PREVIEW_SIZE = 896
NO_CASE = "Open a case from the library (or upload a film) first."
# The read form: component name -> its empty value (a box unticked, a choice and a number not given).
FORM_DEFAULTS: dict[str, Any] = {
    "read_effusion": False, "read_effusion_side": "", "read_effusion_size": "",
    "read_pneumothorax": False, "read_pneumothorax_side": "", "read_pneumothorax_size": "",
    "read_nodule": False, "read_nodule_lobe": "", "read_nodule_size": None,
    "read_consolidation": False, "read_consolidation_lobe": "",
    "read_cardiomegaly": False, "read_ctr": None,
    "read_ett": False, "read_ett_tip": None,
    "read_line": False, "read_line_route": "", "read_line_tip": "",
    "read_pacemaker": False, "read_pacemaker_side": "",
    "read_rotated": "", "read_inspiration": "", "read_exposure": "", "read_rest_absent": False, "read_notes": "",
}  # fmt: skip
# The "what changed since the prior" read (a case with a prior): one choice per finding, "" for no change claimed.
CHANGE_FORM = {f"change_{finding}": "" for finding in FINDINGS}
FORM_DEFAULTS.update(CHANGE_FORM)
FORM = list(FORM_DEFAULTS)


class ViewFiles:
    """The viewer's pictures as fast PNGs (zlib level 1: a textured film at Gradio's default level costs several
    times the render itself). Gradio copies each returned file into its own cache, so a file here is needed only
    for moments; each write deletes those older than KEEP_S. The folder is private (0700) to the server.

    Views are cached by what they show (the film's content key and the view state: window, level, zoom, focus,
    marks): going back to a preset or a window already seen costs no render and no encoding. The cache holds
    names, not pictures; a file older than KEEP_S is re-rendered."""

    KEEP_S = 60.0
    CACHED = 64

    def __init__(self, parent: Path) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="teaching-views-", dir=parent))
        self._cache: dict[object, Path] = {}
        self._lock = threading.Lock()

    def _sweep(self) -> None:
        cutoff = time.time() - self.KEEP_S
        for old in self.folder.glob("*.png"):
            try:
                if old.stat().st_mtime < cutoff:
                    old.unlink()
            except FileNotFoundError:
                pass  # another request removed it first

    def write(self, picture) -> str:
        from PIL import Image

        self._sweep()
        path = self.folder / f"view-{uuid.uuid4().hex}.png"
        Image.fromarray(picture).save(path, format="PNG", compress_level=1)
        return str(path)

    def cached(self, key: object, render) -> str:
        """The view for key: a recent file when one shows exactly this, else render() written as a new one."""
        with self._lock:
            path = self._cache.get(key)
        if path is not None:
            try:
                if path.stat().st_mtime >= time.time() - self.KEEP_S / 2:  # kept well clear of the sweep
                    return str(path)
            except FileNotFoundError:
                pass
        written = Path(self.write(render()))
        with self._lock:
            self._cache[key] = written
            while len(self._cache) > self.CACHED:
                self._cache.pop(next(iter(self._cache)))
        return str(written)


@dataclass
class TeachingPage:
    service: InferenceSurface
    intake: FilmIntake
    asking: Asking
    uploads: UploadInbox
    view_files: ViewFiles
    library_lock: threading.Lock = field(default_factory=threading.Lock)
    practice: PracticeMemory = field(init=False)  # each student's missed findings (teaching/practice.py)

    def __post_init__(self) -> None:
        self.practice = PracticeMemory(Path(self.settings.log_dir) / MEMORY_FILE)

    @property
    def settings(self):
        return self.service.settings

    @property
    def export_root(self) -> Path:
        return Path(self.uploads.folder)

    def library_folder(self) -> Path:
        """Resolved when the page is first opened, not at start-up: writing the starter set takes seconds."""
        from medgemma_xray.teaching.library import SIDECAR_SUFFIX, STARTER_PAIRS, write_starter_set

        with self.library_lock:
            settings = self.settings
            if settings.case_library is not None:
                return Path(settings.case_library)
            folder = Path(settings.log_dir) / "case-library"
            if not any(folder.glob(f"*{SIDECAR_SUFFIX}")):
                write_starter_set(folder, pairs=STARTER_PAIRS)
            return folder

    def library(self):
        from medgemma_xray.teaching.library import load_library

        return load_library(self.library_folder())


def session_of(values: dict) -> SessionSlot[TeachingSession]:
    state = values["session"]
    if isinstance(state, SessionSlot) and isinstance(state.value, TeachingSession):
        return state
    return SessionSlot(TeachingSession())


def current_round(values: dict) -> tuple[SessionSlot[TeachingSession], TeachingSession, Round]:
    session = session_of(values)
    held = session.value
    if held.current is None:
        raise refused(NO_CASE, logger, "teaching")
    return session, held, held.current


QUESTIONS_LOCKED = "Quiz mode: commit your read and press Reveal first; the questions open after the reveal."


def questions_locked(page: TeachingPage, quiz: bool, round_: Round | None) -> bool:
    """Guess first: in quiz mode no question is answered about a case before its reveal, unless the operator's
    TEACHING_QUESTIONS_BEFORE_REVEAL opens them (a round that discusses the film first)."""
    if round_ is None or not quiz or round_.revealed:
        return False
    return not page.settings.teaching_questions_before_reveal


def question_controls(locked: bool) -> dict:
    """The Question box and Ask, locked (with the reason in the box) or open."""
    import gradio as gr

    placeholder = QUESTIONS_LOCKED if locked else "Ask about the film on screen"
    return {
        "question": gr.update(interactive=not locked, placeholder=placeholder),
        "ask_button": gr.update(interactive=not locked),
    }


def read_form(interactive: bool, reset: bool = False) -> dict:
    """The read form's components open or locked (after the reveal the read is the one that was scored); reset:
    back to an empty read too (a new case)."""
    import gradio as gr

    if reset:
        return {name: gr.update(value=value, interactive=interactive) for name, value in FORM_DEFAULTS.items()}
    return {name: gr.update(interactive=interactive) for name in FORM}


def hidden_update():
    import gradio as gr

    return gr.update(value=None, visible=False)
