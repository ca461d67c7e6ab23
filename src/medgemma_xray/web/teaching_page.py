"""The teaching-rounds page (/teaching): the case library, the viewer, guess-first quiz, questions, Stop, the
report with its clinical context and SR export, and the session export. Logic lives in teaching/; this module is
the layout (add_teaching_page) and module-level handlers, each declared with the events that run it
(web.page_wiring).

It keeps the main page's rules: films through the one intake (no toast per warning: they are in the case's
notes), questions through web.asking (limits on the whole conversation, one answer at a time per case, Stop by
a server-side token), and each stream bound to the case it started on (web.page_session). A session keeps the
viewer's overview of its film; the full-resolution values stay once in the intake's shared cache.
The viewer renders on the server (medgemma_xray.teaching.viewer): each window, zoom, pan or click returns a new
picture.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medgemma_xray.teaching.rounds import Round, TeachingSession, library_round, round_of, upload_names
from medgemma_xray.web.page_errors import refused, shown
from medgemma_xray.web.page_session import SessionSlot
from medgemma_xray.web.page_style import ACCESSIBILITY_JS, PAGE_STYLE
from medgemma_xray.web.page_wiring import PageEvents

if TYPE_CHECKING:
    from medgemma_xray.intake import FilmIntake
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.asking import Asking
    from medgemma_xray.web.upload_cache import UploadInbox

logger = logging.getLogger("teaching_ui")  # the log name operators know

PREVIEW_SIZE = 896
STREAM_INTERVAL_S = 0.1
ANSWER_STOPPED = "*Stopped. Ask again or ask another question.*"
REVEAL_STOPPED = "*Stopped before the report was complete. Press Reveal to run it again.*"
NO_CASE = "Open a case from the library (or upload a film) first."
FINDING_CHOICES = {
    "effusion_side": ["", "right", "left", "both"],
    "effusion_size": ["", "small", "moderate", "large"],
    "side": ["", "right", "left"],
    "pneumothorax_size": ["", "small", "large"],
    "yes_no": ["", "yes", "no"],
    "inspiration": ["", "adequate", "poor"],
    "exposure": ["", "adequate", "under", "over"],
}
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
    "read_rotated": "", "read_inspiration": "", "read_exposure": "", "read_notes": "",
}  # fmt: skip
FORM = list(FORM_DEFAULTS)
# elem_id of each button -> its key; the page's script clicks the button (typing in a text box is left alone).
SHORTCUTS = {
    "1": "teach-lung",
    "2": "teach-mediastinum",
    "3": "teach-bone",
    "0": "teach-file-window",
    "i": "teach-invert",
    "r": "teach-reset",
    "+": "teach-zoom-in",
    "=": "teach-zoom-in",
    "-": "teach-zoom-out",
    "p": "teach-projector",
}
SHORTCUT_JS = (
    "() => { if (window.__teachKeys) return; window.__teachKeys = true; const map = "
    + str(SHORTCUTS).replace("'", '"')
    + """;
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.tagName === 'SELECT' || t.isContentEditable)) return;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const id = map[e.key.toLowerCase()];
    const button = id && document.getElementById(id);
    if (button) { e.preventDefault(); button.click(); }
  });
}"""
)
PROJECTOR_CSS = (
    "body.projector .teach-engineering, body.projector #model-badge, body.projector .teach-form "
    "{display: none !important;} "
    "body.projector #teach-view-col {flex-grow: 5 !important; min-width: 66% !important;} "
    "body.projector #teach-view img {max-height: 86vh !important;} "
    "body.projector #teach-chat, body.projector #teach-reveal-box {font-size: 1.35em;}"
)
PROJECTOR_JS = (
    "() => { if (!document.getElementById('teach-projector-css')) { const s = document.createElement('style');"
    f" s.id = 'teach-projector-css'; s.textContent = {PROJECTOR_CSS!r}; document.head.appendChild(s); }}"
    " document.body.classList.toggle('projector'); }"
)
# The clickable view is one image button for the ruler, calliper and pan: its accessible name says so.
VIEW_ALT = "The film at full resolution: click to place a ruler or calliper point, or to pan"
EVENTS = PageEvents()


# --- what the handlers share -------------------------------------------------------------------------------------
class ViewFiles:
    """The viewer's pictures as fast PNGs (zlib level 1: a textured film at Gradio's default level costs several
    times the render itself). Gradio copies each returned file into its own cache, so a file here is needed only
    for moments; each write deletes those older than KEEP_S. The folder is private (0700) to the server."""

    KEEP_S = 60.0

    def __init__(self, parent: Path) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="teaching-views-", dir=parent))

    def write(self, picture) -> str:
        from PIL import Image

        cutoff = time.time() - self.KEEP_S
        for old in self.folder.glob("*.png"):
            try:
                if old.stat().st_mtime < cutoff:
                    old.unlink()
            except FileNotFoundError:
                pass  # another request removed it first
        path = self.folder / f"view-{uuid.uuid4().hex}.png"
        Image.fromarray(picture).save(path, format="PNG", compress_level=1)
        return str(path)


@dataclass
class TeachingPage:
    service: InferenceSurface
    intake: FilmIntake
    asking: Asking
    uploads: UploadInbox
    view_files: ViewFiles
    library_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def settings(self):
        return self.service.settings

    @property
    def export_root(self) -> Path:
        return Path(self.uploads.folder)

    def library_folder(self) -> Path:
        """Resolved when the page is first opened, not at start-up: writing the starter set takes seconds."""
        from medgemma_xray.teaching.library import SIDECAR_SUFFIX, write_starter_set

        with self.library_lock:
            settings = self.settings
            if settings.case_library is not None:
                return Path(settings.case_library)
            folder = Path(settings.log_dir) / "case-library"
            if not any(folder.glob(f"*{SIDECAR_SUFFIX}")):
                write_starter_set(folder)
            return folder

    def library(self):
        from medgemma_xray.teaching.library import load_library

        return load_library(self.library_folder())


def _session(values: dict) -> SessionSlot[TeachingSession]:
    state = values["session"]
    if isinstance(state, SessionSlot) and isinstance(state.value, TeachingSession):
        return state
    return SessionSlot(TeachingSession())


def _current(values: dict) -> tuple[SessionSlot[TeachingSession], TeachingSession, Round]:
    session = _session(values)
    held = session.value
    if held.current is None:
        raise refused(NO_CASE, logger, "teaching")
    return session, held, held.current


def _student_read(values: dict) -> tuple[dict, str]:
    """The read form's values (keyed by component name) as a scoring read, and the free-text notes."""

    def v(name: str):
        return values.get(name, FORM_DEFAULTS[name])

    read: dict = {
        "present.pleural_effusion": bool(v("read_effusion")),
        "present.cardiomegaly": bool(v("read_cardiomegaly")),
        "present.pneumothorax": bool(v("read_pneumothorax")),
        "present.nodule_or_mass": bool(v("read_nodule")),
        "present.consolidation": bool(v("read_consolidation")),
        "present.endotracheal_tube": bool(v("read_ett")),
        "present.central_line": bool(v("read_line")),
        "present.pacemaker": bool(v("read_pacemaker")),
    }
    optional = {
        "cardiothoracic_ratio": v("read_ctr"),
        "technique.rotated": {"yes": True, "no": False}.get(v("read_rotated") or ""),
        "technique.inspiration": v("read_inspiration"),
        "technique.exposure": v("read_exposure"),
        "effusion.side": v("read_effusion_side") if read["present.pleural_effusion"] else None,
        "effusion.size": v("read_effusion_size") if read["present.pleural_effusion"] else None,
        "pneumothorax.side": v("read_pneumothorax_side") if read["present.pneumothorax"] else None,
        "pneumothorax.size": v("read_pneumothorax_size") if read["present.pneumothorax"] else None,
        "nodule.lobe": v("read_nodule_lobe") if read["present.nodule_or_mass"] else None,
        "nodule.size_cm": v("read_nodule_size") if read["present.nodule_or_mass"] else None,
        "consolidation.lobe": v("read_consolidation_lobe") if read["present.consolidation"] else None,
        "endotracheal_tube.tip_above_carina_cm": v("read_ett_tip") if read["present.endotracheal_tube"] else None,
        "central_line.route": v("read_line_route") if read["present.central_line"] else None,
        "central_line.tip": v("read_line_tip") if read["present.central_line"] else None,
        "pacemaker.side": v("read_pacemaker_side") if read["present.pacemaker"] else None,
    }
    read.update({name: value for name, value in optional.items() if value not in (None, "")})
    return read, (v("read_notes") or "").strip()


def _scores_markdown(round_: Round) -> tuple[str, str, str]:
    """(marks table, student score line, model score line) for a revealed round."""
    from medgemma_xray.teaching.scoring import score_read, shown

    if round_.key is None:
        return "No answer key for this film: nothing to score. Load a teacher's key to score it.", "", ""
    student = score_read(round_.student_read, round_.key) if round_.student_read is not None else None
    model = score_read(round_.model_read or {}, round_.key)
    lines = ["| Field | Key | Student | Model |", "|---|---|---|---|"]
    for mark in model.marks:
        s = student.mark(mark.field) if student else None
        cell = "–" if s is None else f"{shown(s.read)} ({'right' if s.right else '**wrong**'})"
        lines.append(
            f"| {mark.label} | {shown(mark.key)} | {cell} | {shown(mark.read)} ({'right' if mark.right else '**wrong**'}) |"
        )
    student_line = f"**Student score: {student.summary()}**" if student else "Student score: no read entered"
    return "\n".join(lines), student_line, f"**Model score: {model.summary()}**"


def export_label(title: str) -> str:
    """A case's title as a file-name label (lowercase letters, digits and hyphens, at most 32): exports are named
    by the case, never by an uploaded file's name."""
    label = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:32].strip("-")
    return label or "case"


def export_stem(kind: str, label: str, day: datetime.date | None = None) -> str:
    """2026-12-03_teaching-report-3f9a_right-pleural-effusion: the date, the export's short id and the case, so two
    exports never share a name (the files of one export share the stem)."""
    return f"{(day or datetime.date.today()).isoformat()}_{kind}-{uuid.uuid4().hex[:4]}_{label}"


def _write_private(folder: Path, name: str, data: bytes) -> str:
    path = folder / name
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    return str(path)


def _hidden():
    import gradio as gr

    return gr.update(value=None, visible=False)


# --- the view -------------------------------------------------------------------------------------------------------
VIEW_OUT = ["view", "centre", "width", "measure"]


def _view_outputs(page: TeachingPage, round_: Round) -> dict[str, Any]:
    import gradio as gr

    from medgemma_xray.teaching import viewer

    display = round_.display
    full = None
    if viewer.needs_full(display, round_.view):
        values = page.intake.values(display.key)
        full = values.values if values is not None else None
    picture = page.view_files.write(viewer.render_view(display, round_.view, full=full)[0])
    low, high = display.window_limits
    span = max(high - low, 1.0)
    measure = viewer.measurement_text(display, round_.view)
    if full is None and viewer.needs_full(display, round_.view):
        measure += "\n\n_Zoomed past the kept copy's detail: open the case again to see the film at full resolution._"
    return {
        "view": picture,
        "centre": gr.update(value=round_.view.centre, minimum=low, maximum=high),
        "width": gr.update(value=round_.view.width, minimum=1.0, maximum=2 * span),
        "measure": measure,
    }


def _view_changed(page: TeachingPage, values: dict, change) -> dict:
    session, held, round_ = _current(values)
    changed = replace(round_, view=change(round_))
    session.update(lambda s: s.updated(changed) if s.current is round_ else s)
    return {**_view_outputs(page, changed), "session": session}


def _register_preset(name: str) -> None:
    def handler(page: TeachingPage, values: dict) -> dict:
        return _view_changed(page, values, lambda r: r.view.with_window(*r.display.preset(name)))

    handler.__name__ = f"window_{name}"
    handler.__doc__ = f"The {name} window preset."
    EVENTS.on([f"{name}_button.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"],
              api_name=f"teaching_window_{name}")(handler)  # fmt: skip


for _preset in ("lung", "mediastinum", "bone", "file"):
    _register_preset(_preset)


@EVENTS.on(["invert_button.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_invert")
def invert(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: replace(r.view, invert=not r.view.invert))


@EVENTS.on(["zoom_in.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_zoom_in")
def zoom_in(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.zoomed(r.view.zoom * 2.0))


@EVENTS.on(["zoom_out.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_zoom_out")
def zoom_out(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.zoomed(r.view.zoom * 0.5))


@EVENTS.on(["reset_button.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_reset")
def reset(page: TeachingPage, values: dict) -> dict:
    from medgemma_xray.teaching import viewer

    return _view_changed(page, values, lambda r: replace(viewer.ViewState.initial(r.display), tool=r.view.tool))


@EVENTS.on(["centre.release", "width.release"], inputs=["centre", "width", "session"], outputs=[*VIEW_OUT, "session"],
           api_name="teaching_window")  # fmt: skip
def set_window(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.with_window(values["centre"], values["width"]))


@EVENTS.on(["tool.change"], inputs=["tool", "session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_tool")
def set_tool(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.with_tool(values["tool"]))


@EVENTS.on(["view.select"], inputs=["session"], outputs=[*VIEW_OUT, "session"], event=True)
def clicked(page: TeachingPage, values: dict, event) -> dict:
    from medgemma_xray.teaching import viewer

    x, y = event.index
    return _view_changed(page, values, lambda r: viewer.click(r.display, r.view, float(x), float(y)))


# --- cases ---------------------------------------------------------------------------------------------------------
CASE_OUT = [*VIEW_OUT, "model_view", "case_info", "reveal_box", "student_score", "model_score", "chat", "indication",
            "comparison", "recommendation", "report_md", "report_sr", *FORM, "session"]  # fmt: skip


def _case_markdown(round_: Round) -> str:
    key = "answer key loaded" if round_.key is not None else "no answer key"
    display = round_.display
    calibration = (
        f"pixel spacing {display.pixel_spacing_mm[1]:.4g} mm" if display.pixel_spacing_mm else "uncalibrated (no pixel spacing)"
    )  # fmt: skip
    rows, cols = display.shape
    notes = "".join(f"\n- ⚠️ {warning}" for warning in round_.warnings)
    return (
        f"### {round_.title}\n**History:** {round_.history or '–'}\n\n"
        f"_{round_.film.source}, {cols}×{rows} px; {key}; {calibration}_" + (f"\n{notes}" if notes else "")
    )


def _preview_of(image):
    preview = image.resize((PREVIEW_SIZE, PREVIEW_SIZE))
    preview.info["upload"] = uuid.uuid4().hex  # its own cache file (see the main page's load_film)
    return preview


def _leave_round(page: TeachingPage, held: TeachingSession, wait_s: float = 10.0) -> None:
    """The case on screen is replaced: its running answer or report stops and writes nothing more (the new case's
    reply waits for its stream to end, so no last update of it lands after); its KV is freed."""
    if held.current is not None:
        page.asking.end_conversation(held.current.conversation_id, wait_s=wait_s)
        page.service.forget_conversation(held.current.conversation_id)


def _opened(page: TeachingPage, session: SessionSlot[TeachingSession], round_: Round, forbidden=frozenset()) -> dict:
    _leave_round(page, session.value)
    session.update(lambda s: s.with_round(round_, forbidden))
    return {
        **_view_outputs(page, round_),
        "model_view": _preview_of(round_.model_image),
        "case_info": _case_markdown(round_),
        "reveal_box": "",
        "student_score": "",
        "model_score": "",
        "chat": [],
        "indication": round_.history,
        "comparison": round_.comparison,
        "recommendation": "",
        "report_md": _hidden(),
        "report_sr": _hidden(),
        **FORM_DEFAULTS,  # a new case starts a fresh read
        "session": session,
    }


def _read_film(page: TeachingPage, data: bytes):
    """The film for the model and for the viewer, from the one intake's one decode."""
    from medgemma_xray.teaching.viewer import display_film

    film, values = page.intake.read_with_values(data)
    return film, display_film(values, film.source, film.key)


@EVENTS.on(["open_button.click"], inputs=["case_list", "session"], outputs=CASE_OUT, api_name="teaching_open_case")
def open_case(page: TeachingPage, values: dict) -> dict:
    case_id = values["case_list"]
    if not case_id:
        raise refused("Pick a case in the library list first.", logger, "teaching")
    session = _session(values)
    try:
        case = page.library().get(case_id)
    except KeyError as exc:
        raise refused("That case is no longer in the library; refresh the list.", logger, "teaching") from exc
    try:
        film, display = _read_film(page, case.film_path.read_bytes())
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    return _opened(page, session, library_round(case, film, display))


@EVENTS.on(["next_button.click"], inputs=["session"], outputs=["case_list", *CASE_OUT], api_name="teaching_next_case")
def next_case(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    case_id = _session(values).value.next_case_id()
    if case_id is None:
        raise refused("No next case: press Shuffle for a quiz order (or the round is over).", logger, "teaching")
    return {"case_list": gr.update(value=case_id), **open_case(page, {**values, "case_list": case_id})}


@EVENTS.on(["shuffle_button.click"], inputs=["session"], outputs=["case_list", "order_note", "session"],
           api_name="teaching_shuffle")  # fmt: skip
def shuffle(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    session = _session(values)
    library = page.library()
    held = session.update(lambda s: s.shuffled_order([case.case_id for case in library.cases]))
    titles = [library.get(case_id).title for case_id in held.order]
    return {
        "case_list": gr.update(value=held.order[0] if held.order else None),
        "order_note": f"Quiz order: {', '.join(titles)}",
        "session": session,
    }


@EVENTS.on(["film_upload.upload"], inputs=["film_upload", "session"], outputs=CASE_OUT,
           api_name="teaching_upload_film")  # fmt: skip
def upload_film(page: TeachingPage, values: dict) -> dict:
    file_path = values["film_upload"]
    if not file_path:
        raise refused("No file received. Drop a chest X-ray (DICOM, PNG or JPEG) onto the upload box.", logger,
                      "teaching")  # fmt: skip
    session = _session(values)
    try:
        data = page.uploads.take(file_path)
        film, display = _read_film(page, data)
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    held = session.update(lambda s: replace(s, uploads=s.uploads + 1))
    round_ = round_of(f"Uploaded film {held.uploads}", film, display)
    forbidden = upload_names(file_path) | set(display.dicom_identity.values())
    return _opened(page, session, round_, forbidden)


@EVENTS.on(["key_upload.upload"], inputs=["key_upload", "session"], outputs=["case_info", "session"],
           api_name="teaching_upload_key")  # fmt: skip
def upload_key(page: TeachingPage, values: dict) -> dict:
    from medgemma_xray.teaching.keys import key_from_json

    session, _, round_ = _current(values)
    if not values["key_upload"]:
        raise refused("No key file received.", logger, "teaching")
    try:
        key = key_from_json(page.uploads.take(values["key_upload"]), "The key file")
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    keyed = replace(round_, key=key)
    session.update(lambda s: s.updated(keyed) if s.current is round_ else s)
    return {"case_info": _case_markdown(keyed), "session": session}


@EVENTS.on(["route.load"], outputs=["case_list", "library_note"], js=f"() => {{ ({SHORTCUT_JS})(); ({ACCESSIBILITY_JS})(); }}",
           api_name="teaching_cases")  # fmt: skip
def list_cases(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    library = page.library()
    lines = [f"{len(library.cases)} cases in the library."] + [f"⚠️ {p}" for p in library.problems]
    return {"case_list": gr.update(choices=library.choices()), "library_note": "\n\n".join(lines)}


# --- answers: streamed, bound to their case, stoppable ------------------------------------------------------------
def _throttled(text_stream):
    """At most one update per STREAM_INTERVAL_S (a browser that re-renders the whole answer at every token falls
    behind a fast backend); the last text always comes."""
    shown_at, text, pending = 0.0, "", False
    for text in text_stream:
        pending = True
        if time.monotonic() - shown_at >= STREAM_INTERVAL_S:
            shown_at, pending = time.monotonic(), False
            yield text
    if pending:
        yield text


def _claim(page: TeachingPage, session: SessionSlot, round_: Round, request):
    from medgemma_xray.web.main_page import _client_of

    try:
        page.asking.admit(_client_of(request))
        ticket = page.asking.claim(round_.conversation_id)
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    session.answer_token = ticket.stop_token
    return ticket


def _release(page: TeachingPage, session: SessionSlot, ticket) -> None:
    page.asking.release(ticket)
    if session.answer_token == ticket.stop_token:
        session.answer_token = None


@EVENTS.on(["reveal_button.click"], inputs=["quiz", *FORM, "session"],
           outputs=["reveal_box", "student_score", "model_score", "session"], request=True, api_name="teaching_reveal",
           concurrency_id="generation")  # fmt: skip
def reveal(page: TeachingPage, values: dict, request) -> Any:
    from medgemma_xray.assistant.report import report_request
    from medgemma_xray.inference_api.types import GenerationStats
    from medgemma_xray.teaching.model_read import model_read

    session, _, round_ = _current(values)
    if round_.revealed:
        raise refused("This case is already revealed; open the next case.", logger, "teaching")
    read, notes = _student_read(values)
    asked = replace(round_, student_read=read, student_notes=notes) if values["quiz"] else round_
    ticket = _claim(page, session, round_, request)
    generation = replace(report_request(round_.model_image, page.settings.max_new_tokens), image_key=round_.image_key)
    text = ""
    try:
        yield {"reveal_box": "**The model's report (streaming)**", "student_score": "", "model_score": ""}
        for text in _throttled(page.asking.stream(generation, ticket, GenerationStats())):
            if ticket.superseded:
                return
            yield {"reveal_box": f"**The model's report (streaming)**\n\n```text\n{text}\n```"}
        if ticket.superseded:
            return
        if ticket.stopped.is_set():  # a stopped report is not the model's read: the case stays to be revealed
            yield {"reveal_box": f"**The model's report (stopped)**\n\n```text\n{text}\n```\n\n{REVEAL_STOPPED}"}
            return
        revealed = replace(asked, model_report=text, model_read=model_read(text), revealed=True)
        held = session.update(lambda s: s.updated(revealed) if s.current is round_ else s)
        if held.current is not revealed:
            return
        table, student_line, model_line = _scores_markdown(revealed)
        points = "".join(f"\n- {p}" for p in revealed.teaching_points)
        box = f"**The model's report**\n\n```text\n{text}\n```\n\n{table}" + (
            f"\n\n**Teaching points**{points}" if points else ""
        )
        yield {"reveal_box": box, "student_score": student_line, "model_score": model_line, "session": session}
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    finally:
        _release(page, session, ticket)


def _question_request(page: TeachingPage, round_: Round, question: str):
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
    from medgemma_xray.web.asking import AskRefused

    if not question:
        raise refused("Type a question before asking.", logger, "teaching")
    turns = tuple(t for q, a in round_.questions for t in (ChatTurn("user", q), ChatTurn("assistant", a)))
    request = GenerationRequest(
        image=round_.model_image,
        turns=(*turns, ChatTurn("user", question)),
        max_new_tokens=page.settings.max_new_tokens,
        conversation_id=round_.conversation_id,
        image_key=round_.image_key,
    )
    try:
        page.asking.check(request)
    except AskRefused as exc:
        raise shown(exc, logger, "teaching") from exc
    return request


@EVENTS.on(
    ["ask_button.click", "question.submit"], inputs=["question", "session"], outputs=["asked"], concurrency_limit=None
)
def take_question(page: TeachingPage, values: dict) -> dict:
    """Checked before it is queued (the main page's rules): refused at once with a message, the text kept."""
    from medgemma_xray.web.asking import WAIT_MESSAGE

    _, _, round_ = _current(values)
    question = (values["question"] or "").strip()
    _question_request(page, round_, question)
    if page.asking.is_answering(round_.conversation_id):
        raise refused(WAIT_MESSAGE, logger, "teaching")
    return {"asked": question}


@EVENTS.on(["take_question.success"], outputs=["question"], queue=False)
def clear_question(page: TeachingPage, values: dict) -> dict:
    return {"question": ""}


@EVENTS.on(["clear_question.success"], inputs=["asked", "session"], outputs=["chat", "asked", "session"], request=True,
           api_name="teaching_ask", concurrency_id="generation")  # fmt: skip
def answer(page: TeachingPage, values: dict, request) -> Any:
    from medgemma_xray.inference_api.types import GenerationStats

    session, _, round_ = _current(values)
    question = (values["asked"] or "").strip()
    generation = _question_request(page, round_, question)
    ticket = _claim(page, session, round_, request)
    history = [
        m for q, a in round_.questions for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})
    ]
    history.append({"role": "user", "content": question})
    text = ""
    try:
        yield {"chat": history + [{"role": "assistant", "content": ""}]}  # the question shows at once
        for text in _throttled(page.asking.stream(generation, ticket, GenerationStats())):
            if ticket.superseded:
                return
            yield {"chat": history + [{"role": "assistant", "content": text}]}
        if ticket.superseded:
            return
        # A stopped answer stays in the conversation as far as it went; the model's next turn sees the same text.
        asked = replace(round_, questions=(*round_.questions, (question, text)))
        held = session.update(lambda s: s.updated(asked) if s.current is round_ else s)
        if held.current is not asked:
            return
        shown_text = f"{text}\n\n{ANSWER_STOPPED}" if ticket.stopped.is_set() else text
        yield {"chat": history + [{"role": "assistant", "content": shown_text}], "asked": "", "session": session}
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    finally:
        _release(page, session, ticket)


@EVENTS.on(["stop_button.click"], inputs=["session"], queue=False, api_name="teaching_stop")
def stop(page: TeachingPage, values: dict) -> None:
    """Stop: this session's running answer or report ends at its next piece of text, keeping what it said. Keyed
    by the answer's server-side token, which no client can name."""
    page.asking.stop(_session(values).answer_token)


# --- exports -------------------------------------------------------------------------------------------------------
@EVENTS.on(["report_button.click"], inputs=["indication", "comparison", "recommendation", "identifiers", "session"],
           outputs=["report_md", "report_sr"], api_name="teaching_report")  # fmt: skip
def export_report(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    from medgemma_xray.assistant.report import parse_report
    from medgemma_xray.teaching.report_context import ClinicalContext, TeachingReport
    from medgemma_xray.teaching.sr import sr_bytes

    _, _, round_ = _current(values)
    if not round_.revealed:
        raise refused("Reveal the case first: the report is the model's read.", logger, "teaching")
    context = ClinicalContext(values["indication"] or "", values["comparison"] or "", values["recommendation"] or "")
    report = TeachingReport(context, parse_report(round_.model_report))
    folder = Path(tempfile.mkdtemp(prefix="teaching-report-", dir=page.export_root))
    allowed = bool(values["identifiers"]) and page.settings.sr_include_identifiers
    try:
        sr = sr_bytes(report, round_.display.dicom_identity, include_identifiers=allowed)
        markdown = report.markdown().encode("utf-8", "replace")
    except Exception as exc:
        raise shown(exc, logger, "teaching") from exc
    label = export_label(round_.title)
    stem = export_stem("teaching-report", label)
    md = _write_private(folder, f"{stem}.md", markdown)
    dcm = _write_private(folder, f"{stem}-sr.dcm", sr)
    return {"report_md": gr.update(value=md, visible=True), "report_sr": gr.update(value=dcm, visible=True)}


@EVENTS.on(["export_button.click"], inputs=["session"], outputs=["session_csv", "session_pdf"],
           api_name="teaching_export")  # fmt: skip
def export_session(page: TeachingPage, values: dict) -> dict:
    import gradio as gr

    from medgemma_xray.teaching.session_export import session_csv, session_pdf

    held = _session(values).value
    if not held.records:
        raise refused("Nothing to export yet: reveal at least one case.", logger, "teaching")
    folder = Path(tempfile.mkdtemp(prefix="teaching-session-", dir=page.export_root))
    records = list(held.records)
    stem = export_stem("teaching-session", f"{len(records)}-cases")
    csv_path = _write_private(folder, f"{stem}.csv", session_csv(records, held.forbidden).encode("utf-8"))
    pdf_path = _write_private(folder, f"{stem}.pdf", session_pdf(records, held.forbidden))
    return {
        "session_csv": gr.update(value=csv_path, visible=True),
        "session_pdf": gr.update(value=pdf_path, visible=True),
    }


EVENTS.js("projector_layout", ["projector.click"], PROJECTOR_JS)


def session_ended(page: TeachingPage, state: object) -> None:
    """A closed tab (or an expired session): its running answer stops and its KV is freed."""
    if isinstance(state, SessionSlot) and isinstance(state.value, TeachingSession):
        _leave_round(page, state.value, wait_s=0)


# --- the layout ----------------------------------------------------------------------------------------------------
def add_teaching_page(
    demo, service: InferenceSurface, uploads: UploadInbox, intake: FilmIntake, asking: Asking
) -> None:
    """Add the /teaching page to the app's Blocks (call after its `with gr.Blocks()` block, before queue())."""
    import gradio as gr

    from medgemma_xray.teaching.keys import ALL_LOBES

    settings = service.settings
    page = TeachingPage(service, intake, asking, uploads, ViewFiles(Path(uploads.folder)))
    ui: dict[str, Any] = {}
    with demo.route("Teaching rounds", "/teaching") as route:
        ui["route"] = route
        ui["session"] = gr.State(SessionSlot(TeachingSession()), delete_callback=lambda s: session_ended(page, s))
        gr.HTML(PAGE_STYLE, padding=False, container=False)
        gr.Markdown(
            "# Teaching rounds\n**For education and research only. Not a medical device and not for diagnosis.** "
            "Keys: 1 lung, 2 mediastinum, 3 bone, 0 the file's window, I invert, +/− zoom, R reset, P projector."
        )
        with gr.Row():
            ui["case_list"] = gr.Dropdown([], label="Case library", elem_id="teach-case", scale=3)
            ui["open_button"] = gr.Button("Open case", elem_id="teach-open", scale=1)
            ui["shuffle_button"] = gr.Button("Shuffle (quiz order)", elem_id="teach-shuffle", scale=1)
            ui["next_button"] = gr.Button("Next case", elem_id="teach-next", scale=1)
            ui["quiz"] = gr.Checkbox(True, label="Quiz: guess first, then reveal", elem_id="teach-quiz", scale=1)
            ui["projector"] = gr.Button("Projector layout (P)", elem_id="teach-projector", scale=1)
        ui["library_note"] = gr.Markdown(elem_id="teach-library", elem_classes="teach-engineering")
        ui["order_note"] = gr.Markdown(elem_id="teach-order", elem_classes="teach-engineering")
        with gr.Row(elem_classes="teach-engineering"):
            ui["film_upload"] = gr.File(
                label="Or upload a film (DICOM, PNG, JPEG)", type="filepath", elem_id="teach-upload"
            )
            ui["key_upload"] = gr.File(label="Teacher's answer key (JSON)", type="filepath", elem_id="teach-key")
        ui["case_info"] = gr.Markdown(elem_id="teach-case-info")
        with gr.Row():
            with gr.Column(scale=3, elem_id="teach-view-col"):
                ui["view"] = gr.Image(
                    label="Full-resolution film (click: ruler, calliper or pan)",
                    interactive=False,
                    type="filepath",
                    elem_id="teach-view",
                    show_label=True,
                    alt_text=VIEW_ALT,
                    buttons=["fullscreen"],  # no "share" (Spaces only), no download of a view file
                )
                with gr.Row():
                    ui["lung_button"] = gr.Button("Lung (1)", elem_id="teach-lung", size="sm")
                    ui["mediastinum_button"] = gr.Button("Mediastinum (2)", elem_id="teach-mediastinum", size="sm")
                    ui["bone_button"] = gr.Button("Bone (3)", elem_id="teach-bone", size="sm")
                    ui["file_button"] = gr.Button("File window (0)", elem_id="teach-file-window", size="sm")
                    ui["invert_button"] = gr.Button("Invert (I)", elem_id="teach-invert", size="sm")
                    ui["zoom_in"] = gr.Button("Zoom + (+)", elem_id="teach-zoom-in", size="sm")
                    ui["zoom_out"] = gr.Button("Zoom − (−)", elem_id="teach-zoom-out", size="sm")
                    ui["reset_button"] = gr.Button("Reset (R)", elem_id="teach-reset", size="sm")
                with gr.Row():
                    ui["centre"] = gr.Slider(0, 4096, value=2048, label="Level (centre)", elem_id="teach-level")
                    ui["width"] = gr.Slider(1, 8192, value=4096, label="Width", elem_id="teach-width")
                    ui["tool"] = gr.Radio(
                        [("Ruler", "ruler"), ("CTR calliper", "ctr"), ("Pan", "pan")],
                        value="ruler",
                        label="Tool",
                        elem_id="teach-tool",
                    )
                ui["measure"] = gr.Markdown(elem_id="teach-measure")
            with gr.Column(scale=2):
                ui["model_view"] = gr.Image(
                    label="What the model sees (padded to square, 896 px)",
                    interactive=False,
                    type="pil",
                    format="png",
                    height=300,
                    alt_text="The film as the model sees it: grey-scale, padded to a square",
                    buttons=["fullscreen"],
                    elem_id="teach-model-view",
                )
                ui["chat"] = gr.Chatbot(
                    label="Questions", height=300, buttons=["copy", "copy_all"], elem_id="teach-chat"
                )  # (the default set has an unnamed icon button)
                ui["question"] = gr.Textbox(label="Question", elem_id="teach-question")
                ui["asked"] = gr.Textbox(label="Question", visible=False, elem_id="teach-asked")
                with gr.Row():
                    ui["ask_button"] = gr.Button("Ask", variant="primary", elem_id="teach-ask")
                    ui["stop_button"] = gr.Button("Stop", variant="stop", elem_id="teach-stop")
        with gr.Accordion("Your read (before the reveal)", open=True, elem_classes="teach-form"):
            _read_form(ui, [""] + list(ALL_LOBES))
        ui["reveal_button"] = gr.Button("Reveal", variant="primary", elem_id="teach-reveal")
        with gr.Row():
            ui["student_score"] = gr.Markdown(elem_id="teach-student-score")
            ui["model_score"] = gr.Markdown(elem_id="teach-model-score")
        ui["reveal_box"] = gr.Markdown(elem_id="teach-reveal-box")
        with gr.Accordion("Report: indication, comparison, recommendation; Markdown and DICOM SR", open=False):
            ui["indication"] = gr.Textbox(label="Indication", elem_id="teach-indication")
            ui["comparison"] = gr.Textbox(label="Comparison", elem_id="teach-comparison")
            ui["recommendation"] = gr.Textbox(label="Recommendation", elem_id="teach-recommendation")
            ui["identifiers"] = gr.Checkbox(
                False,
                label="Include the source film's patient and study in the SR (only a DICOM film that has them)",
                interactive=settings.sr_include_identifiers,
                info=None if settings.sr_include_identifiers else "Off: the operator has not allowed identifiers.",
                elem_id="teach-sr-identifiers",
            )
            ui["report_button"] = gr.Button("Make the report", elem_id="teach-report")
            with gr.Row():
                ui["report_md"] = gr.DownloadButton("Report (Markdown)", visible=False, elem_id="teach-report-md")
                ui["report_sr"] = gr.DownloadButton("Report (DICOM SR)", visible=False, elem_id="teach-report-sr")
        ui["export_button"] = gr.Button("Export the session (CSV and PDF)", elem_id="teach-export")
        with gr.Row():
            ui["session_csv"] = gr.DownloadButton("Session (CSV)", visible=False, elem_id="teach-csv")
            ui["session_pdf"] = gr.DownloadButton("Session handout (PDF)", visible=False, elem_id="teach-pdf")
        EVENTS.wire(ui, page, concurrency={"generation": settings.generation_concurrency})


def _read_form(ui: dict[str, Any], lobes: list[str]) -> None:
    """The student's read: one component per FORM_DEFAULTS name, elem_id read-* (the browser tests use them)."""
    import gradio as gr

    def choice(name: str, choices: list[str], label: str) -> None:
        ui[name] = gr.Dropdown(choices, value="", label=label, elem_id=name.replace("_", "-"))

    def number(name: str, label: str) -> None:
        ui[name] = gr.Number(None, label=label, elem_id=name.replace("_", "-"))

    def box(name: str, label: str) -> None:
        ui[name] = gr.Checkbox(label=label, elem_id=name.replace("_", "-"))

    with gr.Row():
        box("read_effusion", "Pleural effusion")
        choice("read_effusion_side", FINDING_CHOICES["effusion_side"], "side")
        choice("read_effusion_size", FINDING_CHOICES["effusion_size"], "size")
        box("read_pneumothorax", "Pneumothorax")
        choice("read_pneumothorax_side", FINDING_CHOICES["side"], "side")
        choice("read_pneumothorax_size", FINDING_CHOICES["pneumothorax_size"], "size")
    with gr.Row():
        box("read_nodule", "Nodule or mass")
        choice("read_nodule_lobe", lobes, "lobe")
        number("read_nodule_size", "size (cm)")
        box("read_consolidation", "Consolidation")
        choice("read_consolidation_lobe", lobes, "lobe")
    with gr.Row():
        box("read_cardiomegaly", "Cardiomegaly")
        number("read_ctr", "cardiothoracic ratio")
        box("read_ett", "ET tube")
        number("read_ett_tip", "tip above carina (cm)")
        box("read_pacemaker", "Pacemaker")
        choice("read_pacemaker_side", FINDING_CHOICES["side"], "side")
    with gr.Row():
        box("read_line", "Central line")
        choice("read_line_route", ["", "right internal jugular", "left subclavian"], "route")
        choice("read_line_tip", ["", "superior vena cava", "cavoatrial junction", "right atrium"], "tip")
        choice("read_rotated", FINDING_CHOICES["yes_no"], "rotated")
        choice("read_inspiration", FINDING_CHOICES["inspiration"], "inspiration")
        choice("read_exposure", FINDING_CHOICES["exposure"], "exposure")
    ui["read_notes"] = gr.Textbox(label="Free text", lines=2, elem_id="read-notes")
