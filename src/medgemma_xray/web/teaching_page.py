"""The teaching-rounds page (/teaching): the case library, the viewer, guess-first quiz, questions, Stop, the
report with its clinical context and SR export, and the session export. Logic lives in teaching/; this module is
layout and thin handlers. app.py adds the page with one call: add_teaching_page(demo, service, uploads).

The viewer renders on the server (medgemma_xray.teaching.viewer): each window, zoom, pan or click returns a new picture.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medgemma_xray.teaching.rounds import Round, TeachingSession, library_round, upload_names
from medgemma_xray.web.answer_stops import AnswerStops

if TYPE_CHECKING:
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.upload_cache import UploadInbox

logger = logging.getLogger("teaching_ui")  # the log name operators know

PREVIEW_SIZE = 896
STREAM_INTERVAL_S = 0.1
ANSWER_STOPPED = "*Stopped. Ask again or ask another question.*"
REVEAL_STOPPED = "*Stopped before the report was complete. Press Reveal to run it again.*"
FINDING_CHOICES = {
    "effusion_side": ["", "right", "left", "both"],
    "effusion_size": ["", "small", "moderate", "large"],
    "side": ["", "right", "left"],
    "pneumothorax_size": ["", "small", "large"],
    "yes_no": ["", "yes", "no"],
    "inspiration": ["", "adequate", "poor"],
    "exposure": ["", "adequate", "under", "over"],
}
# The read form's empty values, in _student_read's order: a box unticked, a choice and a number not given.
FORM_DEFAULTS = (False, "", "", False, "", "", False, "", None, False, "", False, None, False, None, False, "", "",
                 False, "", "", "", "", "")  # fmt: skip
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


def _library_folder(settings) -> Path:
    """The configured library, or a starter set of phantoms written once under the log folder."""
    from medgemma_xray.teaching.library import SIDECAR_SUFFIX, write_starter_set

    if settings.case_library is not None:
        return Path(settings.case_library)
    folder = Path(settings.log_dir) / "case-library"
    if not any(folder.glob(f"*{SIDECAR_SUFFIX}")):
        write_starter_set(folder)
    return folder


def _student_read(values: list) -> tuple[dict, str]:
    """The read form's values (in FORM order) as a scoring read, and the free-text notes."""
    (eff, eff_side, eff_size, ptx, ptx_side, ptx_size, nod, nod_lobe, nod_size, cons, cons_lobe, cardio, ctr,
     ett, ett_tip, cvl, cvl_route, cvl_tip, pm, pm_side, rotated, inspiration, exposure, notes) = values  # fmt: skip
    read: dict = {
        "present.pleural_effusion": bool(eff),
        "present.cardiomegaly": bool(cardio),
        "present.pneumothorax": bool(ptx),
        "present.nodule_or_mass": bool(nod),
        "present.consolidation": bool(cons),
        "present.endotracheal_tube": bool(ett),
        "present.central_line": bool(cvl),
        "present.pacemaker": bool(pm),
    }
    optional = {
        "cardiothoracic_ratio": ctr,
        "technique.rotated": {"yes": True, "no": False}.get(rotated or ""),
        "technique.inspiration": inspiration,
        "technique.exposure": exposure,
        "effusion.side": eff_side if eff else None,
        "effusion.size": eff_size if eff else None,
        "pneumothorax.side": ptx_side if ptx else None,
        "pneumothorax.size": ptx_size if ptx else None,
        "nodule.lobe": nod_lobe if nod else None,
        "nodule.size_cm": nod_size if nod else None,
        "consolidation.lobe": cons_lobe if cons else None,
        "endotracheal_tube.tip_above_carina_cm": ett_tip if ett else None,
        "central_line.route": cvl_route if cvl else None,
        "central_line.tip": cvl_tip if cvl else None,
        "pacemaker.side": pm_side if pm else None,
    }
    read.update({name: value for name, value in optional.items() if value not in (None, "")})
    return read, (notes or "").strip()


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


def _stop_key(request) -> str | None:
    """Whose answers a Stop may end: the browser session, and with login on its user too (the session id comes
    from the client, so with login one user cannot name another's session)."""
    if request is None or request.session_hash is None:
        return None
    return f"{request.username or ''}\0{request.session_hash}"


def _write_private(folder: Path, name: str, data: bytes) -> str:
    path = folder / name
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    return str(path)


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


def add_teaching_page(demo, service: InferenceSurface, uploads: UploadInbox) -> None:
    """Add the /teaching page to the app's Blocks (call after its `with gr.Blocks()` block, before queue())."""
    import gradio as gr

    from medgemma_xray.assistant.report import parse_report, report_request
    from medgemma_xray.film_check import NotAChestFilmError, check_film, load_reference
    from medgemma_xray.film_check.check import REFERENCE_PATH
    from medgemma_xray.inference_api.errors import RequestError
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
    from medgemma_xray.serving.service import ServiceUnavailable
    from medgemma_xray.teaching import viewer
    from medgemma_xray.teaching.keys import ALL_LOBES, AnswerKeyError, key_from_json
    from medgemma_xray.teaching.library import load_library
    from medgemma_xray.teaching.model_read import model_read
    from medgemma_xray.teaching.report_context import ClinicalContext, TeachingReport
    from medgemma_xray.teaching.session_export import session_csv, session_pdf
    from medgemma_xray.teaching.sr import sr_bytes
    from medgemma_xray.web.upload_cache import NotAnUploadError, UploadGoneError
    from medgemma_xray.xray_io import ImageInputError
    from medgemma_xray.xray_io.preprocess import model_input_image

    settings = service.settings
    film_reference = (
        None if settings.film_check == "off" else load_reference(settings.film_check_reference or REFERENCE_PATH)
    )
    library_lock = threading.Lock()
    stops = AnswerStops()

    def library_folder() -> Path:
        """Resolved when the page is first opened, not at start-up: writing the starter set takes seconds."""
        with library_lock:
            return _library_folder(settings)

    export_root = Path(uploads.folder)
    view_files = ViewFiles(export_root)

    def user_error(exc: Exception) -> gr.Error:
        logger.warning("teaching: user error: %s", type(exc).__name__)
        return gr.Error(str(exc), duration=None, print_exception=False)

    def refused(message: str) -> gr.Error:
        logger.warning("teaching: user error: incomplete request")
        return gr.Error(message, print_exception=False)

    def need_round(session: TeachingSession) -> Round:
        if not isinstance(session, TeachingSession) or session.current is None:
            raise refused("Open a case from the library (or upload a film) first.")
        return session.current

    def view_outputs(round_: Round):
        picture = view_files.write(viewer.render_view(round_.display, round_.view)[0])
        low, high = round_.display.window_limits
        span = max(high - low, 1.0)
        return (
            picture,
            gr.update(value=round_.view.centre, minimum=low, maximum=high),
            gr.update(value=round_.view.width, minimum=1.0, maximum=2 * span),
            viewer.measurement_text(round_.display, round_.view),
        )

    def preview_of(image):
        preview = image.resize((PREVIEW_SIZE, PREVIEW_SIZE))
        preview.info["upload"] = uuid.uuid4().hex  # its own cache file (see app.py's load_film)
        return preview

    def case_markdown(round_: Round) -> str:
        key = "answer key loaded" if round_.key is not None else "no answer key"
        calibration = (
            f"pixel spacing {round_.display.pixel_spacing_mm[1]:.4g} mm"
            if round_.display.pixel_spacing_mm
            else "uncalibrated (no pixel spacing)"
        )
        return (
            f"### {round_.title}\n**History:** {round_.history or '–'}\n\n_{round_.film.source}; {key}; {calibration}_"
        )

    def opened(session: TeachingSession, round_: Round, forbidden=frozenset()):
        session = session.with_round(round_, forbidden)
        hidden = gr.update(value=None, visible=False)
        return (
            *view_outputs(round_),
            preview_of(round_.model_image),
            case_markdown(round_),
            "",  # reveal box
            "",  # student score
            "",  # model score
            [],  # chat
            round_.history,  # indication
            round_.comparison,  # comparison
            "",  # recommendation
            hidden,
            hidden,
            *FORM_DEFAULTS,  # a new case starts a fresh read
            session,
        )

    def decode(data: bytes):
        """The film for the model and the viewer; the film check (film_check/) as on the main page."""
        film, display = viewer.read_display_film(
            data, max_pixels=settings.max_pixels, max_bytes=settings.max_file_size_bytes
        )
        if film_reference is not None:
            verdict = check_film(film.pixels, film_reference)
            if not verdict.plausible and settings.film_check == "refuse":
                raise NotAChestFilmError(verdict.refusal())
            if not verdict.plausible:
                gr.Warning(verdict.warning())
        return film, display, model_input_image(film)

    def open_case(case_id: str | None, session: TeachingSession):
        if not case_id:
            raise refused("Pick a case in the library list first.")
        session = session if isinstance(session, TeachingSession) else TeachingSession()
        if session.current is not None:
            service.forget_conversation(session.current.conversation_id)
        try:
            case = load_library(library_folder()).get(case_id)
            film, display, image = decode(case.film_path.read_bytes())
        except KeyError as exc:
            raise refused("That case is no longer in the library; refresh the list.") from exc
        except ImageInputError as exc:
            raise user_error(exc) from exc
        for warning in film.warnings:
            gr.Warning(warning)
        return opened(session, library_round(case, film, display, image))

    def upload_film(file_path: str | None, session: TeachingSession):
        if not file_path:
            raise refused("No file received. Drop a chest X-ray (DICOM, PNG or JPEG) onto the upload box.")
        session = session if isinstance(session, TeachingSession) else TeachingSession()
        try:
            data = uploads.take(file_path)
            film, display, image = decode(data)
        except (ImageInputError, NotAnUploadError, UploadGoneError) as exc:
            raise user_error(exc) from exc
        number = session.uploads + 1
        session = replace(session, uploads=number)
        round_ = Round(f"Uploaded film {number}", "", film, display, image, viewer.ViewState.initial(display))
        forbidden = upload_names(file_path) | set(display.dicom_identity.values())
        return opened(session, round_, forbidden)

    def upload_key(file_path: str | None, session: TeachingSession):
        round_ = need_round(session)
        if not file_path:
            raise refused("No key file received.")
        try:
            key = key_from_json(uploads.take(file_path), "The key file")
        except AnswerKeyError as exc:
            raise user_error(exc) from exc
        except (NotAnUploadError, UploadGoneError) as exc:
            raise user_error(exc) from exc
        round_ = replace(round_, key=key)
        session = session.updated(round_)
        return case_markdown(round_), session

    def shuffle(session: TeachingSession):
        session = session if isinstance(session, TeachingSession) else TeachingSession()
        ids = [case.case_id for case in load_library(library_folder()).cases]
        session = session.shuffled_order(ids)
        library = load_library(library_folder())
        titles = [library.get(case_id).title for case_id in session.order]
        return gr.update(value=session.order[0] if session.order else None), f"Quiz order: {', '.join(titles)}", session

    def next_case(session: TeachingSession):
        session = session if isinstance(session, TeachingSession) else TeachingSession()
        case_id = session.next_case_id()
        if case_id is None:
            raise refused("No next case: press Shuffle for a quiz order (or the round is over).")
        return (gr.update(value=case_id), *open_case(case_id, session))

    def view_changed(session: TeachingSession, change):
        round_ = need_round(session)
        round_ = replace(round_, view=change(round_))
        return (*view_outputs(round_), session.updated(round_))

    def preset(name: str):
        def handler(session):
            return view_changed(session, lambda r: r.view.with_window(*r.display.preset(name)))

        return handler

    def set_window(centre: float, width: float, session):
        return view_changed(session, lambda r: r.view.with_window(centre, width))

    def invert(session):
        return view_changed(session, lambda r: replace(r.view, invert=not r.view.invert))

    def zoom(factor: float):
        def handler(session):
            return view_changed(session, lambda r: r.view.zoomed(r.view.zoom * factor))

        return handler

    def reset(session):
        return view_changed(session, lambda r: replace(viewer.ViewState.initial(r.display), tool=r.view.tool))

    def set_tool(tool: str, session):
        return view_changed(session, lambda r: r.view.with_tool(tool))

    def clicked(session, evt):
        x, y = evt.index
        return view_changed(session, lambda r: viewer.click(r.display, r.view, float(x), float(y)))

    clicked.__annotations__["evt"] = gr.SelectData  # Gradio finds the event by type; gr is imported lazily here

    def stop_answers(request) -> None:
        """Stop: the answers this browser session is streaming end at their next piece of text."""
        stops.stop(_stop_key(request))

    def streamed(request, stats, stop: threading.Event):
        """The service's answer stream, at most one update per STREAM_INTERVAL_S (a browser that re-renders the
        whole answer at every token falls behind a fast backend); the last text always comes. Stop sets `stop`:
        the stream ends at its next piece of text, and closing the service's stream (so does a closed tab) frees
        the answer's slot. The handler then returns as any answer does (web/answer_stops.py says why)."""
        stream = service.stream_answer(request, stats)
        shown_at, text, pending = 0.0, "", False
        try:
            for text in stream:
                pending = True
                if stop.is_set():
                    break
                if time.monotonic() - shown_at >= STREAM_INTERVAL_S:
                    shown_at, pending = time.monotonic(), False
                    yield text
        finally:
            stream.close()
        if pending:
            yield text

    def reveal(session: TeachingSession, quiz: bool, request, *form):
        round_ = need_round(session)
        if round_.revealed:
            raise refused("This case is already revealed; open the next case.")
        read, notes = _student_read(list(form))
        if quiz:
            round_ = replace(round_, student_read=read, student_notes=notes)
        text, stats = "", GenerationStats()
        try:
            with stops.answering(_stop_key(request)) as stop:
                for text in streamed(report_request(round_.model_image, settings.max_new_tokens), stats, stop):
                    yield f"**The model's report (streaming)**\n\n```text\n{text}\n```", "", "", session
        except (RequestError, ServiceUnavailable) as exc:
            raise user_error(exc) from exc
        if stop.is_set():  # a stopped report is not the model's read: the case stays to be revealed
            yield f"**The model's report (stopped)**\n\n```text\n{text}\n```\n\n{REVEAL_STOPPED}", "", "", session
            return
        round_ = replace(round_, model_report=text, model_read=model_read(text), revealed=True)
        table, student_line, model_line = _scores_markdown(round_)
        points = "".join(f"\n- {p}" for p in round_.teaching_points)
        box = f"**The model's report**\n\n```text\n{text}\n```\n\n{table}" + (
            f"\n\n**Teaching points**{points}" if points else ""
        )
        yield box, student_line, model_line, session.updated(round_)

    def ask(question: str, session: TeachingSession, request):
        round_ = need_round(session)
        question = (question or "").strip()
        if not question:
            raise refused("Type a question before asking.")
        turns = tuple(t for q, a in round_.questions for t in (ChatTurn("user", q), ChatTurn("assistant", a)))
        generation = GenerationRequest(
            image=round_.model_image,
            turns=(*turns, ChatTurn("user", question)),
            max_new_tokens=settings.max_new_tokens,
            conversation_id=round_.conversation_id,
        )
        history = [
            m
            for q, a in round_.questions
            for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})
        ]
        history.append({"role": "user", "content": question})
        answer = ""
        try:
            with stops.answering(_stop_key(request)) as stop:
                for answer in streamed(generation, GenerationStats(), stop):
                    yield history + [{"role": "assistant", "content": answer}], "", session
        except (RequestError, ServiceUnavailable) as exc:
            raise user_error(exc) from exc
        # A stopped answer stays in the conversation as far as it went; the model's next turn sees the same text.
        round_ = replace(round_, questions=(*round_.questions, (question, answer)))
        shown = f"{answer}\n\n{ANSWER_STOPPED}" if stop.is_set() else answer
        yield history + [{"role": "assistant", "content": shown}], "", session.updated(round_)

    def export_report(
        session: TeachingSession, indication: str, comparison: str, recommendation: str, identifiers: bool
    ):
        round_ = need_round(session)
        if not round_.revealed:
            raise refused("Reveal the case first: the report is the model's read.")
        report = TeachingReport(
            ClinicalContext(indication, comparison, recommendation), parse_report(round_.model_report)
        )
        folder = Path(tempfile.mkdtemp(prefix="teaching-report-", dir=export_root))
        allowed = bool(identifiers) and settings.sr_include_identifiers
        sr = sr_bytes(report, round_.display.dicom_identity, include_identifiers=allowed)
        md = _write_private(folder, "teaching-report.md", report.markdown().encode("utf-8"))
        dcm = _write_private(folder, "teaching-report-sr.dcm", sr)
        return gr.update(value=md, visible=True), gr.update(value=dcm, visible=True)

    def export_session(session: TeachingSession):
        if not isinstance(session, TeachingSession) or not session.records:
            raise refused("Nothing to export yet: reveal at least one case.")
        folder = Path(tempfile.mkdtemp(prefix="teaching-session-", dir=export_root))
        records = list(session.records)
        csv_path = _write_private(
            folder, "teaching-session.csv", session_csv(records, session.forbidden).encode("utf-8")
        )
        pdf_path = _write_private(folder, "teaching-session.pdf", session_pdf(records, session.forbidden))
        return gr.update(value=csv_path, visible=True), gr.update(value=pdf_path, visible=True)

    def session_ended(session) -> None:
        if isinstance(session, TeachingSession) and session.current is not None:
            service.forget_conversation(session.current.conversation_id)

    def list_cases():
        library = load_library(library_folder())
        lines = [f"{len(library.cases)} cases in the library."] + [f"⚠️ {p}" for p in library.problems]
        return gr.update(choices=library.choices()), "\n\n".join(lines)

    with demo.route("Teaching rounds", "/teaching") as page:
        state = gr.State(TeachingSession(), delete_callback=session_ended)
        gr.Markdown(
            "# Teaching rounds\n**For education and research only. Not a medical device and not for diagnosis.** "
            "Keys: 1 lung, 2 mediastinum, 3 bone, 0 the file's window, I invert, +/− zoom, R reset, P projector."
        )
        with gr.Row():
            case_list = gr.Dropdown([], label="Case library", elem_id="teach-case", scale=3)
            open_button = gr.Button("Open case", elem_id="teach-open", scale=1)
            shuffle_button = gr.Button("Shuffle (quiz order)", elem_id="teach-shuffle", scale=1)
            next_button = gr.Button("Next case", elem_id="teach-next", scale=1)
            quiz = gr.Checkbox(True, label="Quiz: guess first, then reveal", elem_id="teach-quiz", scale=1)
            projector = gr.Button("Projector layout (P)", elem_id="teach-projector", scale=1)
        library_note = gr.Markdown(elem_id="teach-library", elem_classes="teach-engineering")
        order_note = gr.Markdown(elem_id="teach-order", elem_classes="teach-engineering")
        with gr.Row(elem_classes="teach-engineering"):
            film_upload = gr.File(label="Or upload a film (DICOM, PNG, JPEG)", type="filepath", elem_id="teach-upload")
            key_upload = gr.File(label="Teacher's answer key (JSON)", type="filepath", elem_id="teach-key")
        case_info = gr.Markdown(elem_id="teach-case-info")
        with gr.Row():
            with gr.Column(scale=3, elem_id="teach-view-col"):
                view = gr.Image(
                    label="Full-resolution film (click: ruler, calliper or pan)",
                    interactive=False,
                    type="filepath",
                    elem_id="teach-view",
                    show_label=True,
                )
                with gr.Row():
                    lung = gr.Button("Lung (1)", elem_id="teach-lung", size="sm")
                    mediastinum = gr.Button("Mediastinum (2)", elem_id="teach-mediastinum", size="sm")
                    bone = gr.Button("Bone (3)", elem_id="teach-bone", size="sm")
                    file_window = gr.Button("File window (0)", elem_id="teach-file-window", size="sm")
                    invert_button = gr.Button("Invert (I)", elem_id="teach-invert", size="sm")
                    zoom_in = gr.Button("Zoom + (+)", elem_id="teach-zoom-in", size="sm")
                    zoom_out = gr.Button("Zoom − (−)", elem_id="teach-zoom-out", size="sm")
                    reset_button = gr.Button("Reset (R)", elem_id="teach-reset", size="sm")
                with gr.Row():
                    centre = gr.Slider(0, 4096, value=2048, label="Level (centre)", elem_id="teach-level")
                    width = gr.Slider(1, 8192, value=4096, label="Width", elem_id="teach-width")
                    tool = gr.Radio(
                        [("Ruler", "ruler"), ("CTR calliper", "ctr"), ("Pan", "pan")],
                        value="ruler",
                        label="Tool",
                        elem_id="teach-tool",
                    )
                measure = gr.Markdown(elem_id="teach-measure")
            with gr.Column(scale=2):
                model_view = gr.Image(
                    label="What the model sees (padded to square, 896 px)",
                    interactive=False,
                    type="pil",
                    format="png",
                    height=300,
                    elem_id="teach-model-view",
                )
                chat = gr.Chatbot(label="Questions", height=300, elem_id="teach-chat")
                question = gr.Textbox(label="Question", elem_id="teach-question")
                with gr.Row():
                    ask_button = gr.Button("Ask", variant="primary", elem_id="teach-ask")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="teach-stop")
        with gr.Accordion("Your read (before the reveal)", open=True, elem_classes="teach-form"):
            lobes = [""] + list(ALL_LOBES)
            with gr.Row():
                eff = gr.Checkbox(label="Pleural effusion", elem_id="read-effusion")
                eff_side = gr.Dropdown(
                    FINDING_CHOICES["effusion_side"], value="", label="side", elem_id="read-effusion-side"
                )
                eff_size = gr.Dropdown(
                    FINDING_CHOICES["effusion_size"], value="", label="size", elem_id="read-effusion-size"
                )
                ptx = gr.Checkbox(label="Pneumothorax", elem_id="read-pneumothorax")
                ptx_side = gr.Dropdown(
                    FINDING_CHOICES["side"], value="", label="side", elem_id="read-pneumothorax-side"
                )
                ptx_size = gr.Dropdown(
                    FINDING_CHOICES["pneumothorax_size"], value="", label="size", elem_id="read-pneumothorax-size"
                )
            with gr.Row():
                nod = gr.Checkbox(label="Nodule or mass", elem_id="read-nodule")
                nod_lobe = gr.Dropdown(lobes, value="", label="lobe", elem_id="read-nodule-lobe")
                nod_size = gr.Number(None, label="size (cm)", elem_id="read-nodule-size")
                cons = gr.Checkbox(label="Consolidation", elem_id="read-consolidation")
                cons_lobe = gr.Dropdown(lobes, value="", label="lobe", elem_id="read-consolidation-lobe")
            with gr.Row():
                cardio = gr.Checkbox(label="Cardiomegaly", elem_id="read-cardiomegaly")
                ctr = gr.Number(None, label="cardiothoracic ratio", elem_id="read-ctr")
                ett = gr.Checkbox(label="ET tube", elem_id="read-ett")
                ett_tip = gr.Number(None, label="tip above carina (cm)", elem_id="read-ett-tip")
                pm = gr.Checkbox(label="Pacemaker", elem_id="read-pacemaker")
                pm_side = gr.Dropdown(FINDING_CHOICES["side"], value="", label="side", elem_id="read-pacemaker-side")
            with gr.Row():
                cvl = gr.Checkbox(label="Central line", elem_id="read-line")
                cvl_route = gr.Dropdown(
                    [""] + ["right internal jugular", "left subclavian"],
                    value="",
                    label="route",
                    elem_id="read-line-route",
                )
                cvl_tip = gr.Dropdown(
                    ["", "superior vena cava", "cavoatrial junction", "right atrium"],
                    value="",
                    label="tip",
                    elem_id="read-line-tip",
                )
                rotated = gr.Dropdown(FINDING_CHOICES["yes_no"], value="", label="rotated", elem_id="read-rotated")
                inspiration = gr.Dropdown(
                    FINDING_CHOICES["inspiration"], value="", label="inspiration", elem_id="read-inspiration"
                )
                exposure = gr.Dropdown(FINDING_CHOICES["exposure"], value="", label="exposure", elem_id="read-exposure")
            notes = gr.Textbox(label="Free text", lines=2, elem_id="read-notes")
        form = [eff, eff_side, eff_size, ptx, ptx_side, ptx_size, nod, nod_lobe, nod_size, cons, cons_lobe, cardio, ctr,
                ett, ett_tip, cvl, cvl_route, cvl_tip, pm, pm_side, rotated, inspiration, exposure, notes]  # fmt: skip
        reveal_button = gr.Button("Reveal", variant="primary", elem_id="teach-reveal")
        with gr.Row():
            student_score = gr.Markdown(elem_id="teach-student-score")
            model_score = gr.Markdown(elem_id="teach-model-score")
        reveal_box = gr.Markdown(elem_id="teach-reveal-box")
        with gr.Accordion("Report: indication, comparison, recommendation; Markdown and DICOM SR", open=False):
            indication = gr.Textbox(label="Indication", elem_id="teach-indication")
            comparison = gr.Textbox(label="Comparison", elem_id="teach-comparison")
            recommendation = gr.Textbox(label="Recommendation", elem_id="teach-recommendation")
            identifiers = gr.Checkbox(
                False,
                label="Include the source film's patient and study in the SR (only a DICOM film that has them)",
                interactive=settings.sr_include_identifiers,
                info=None if settings.sr_include_identifiers else "Off: the operator has not allowed identifiers.",
                elem_id="teach-sr-identifiers",
            )
            report_button = gr.Button("Make the report", elem_id="teach-report")
            with gr.Row():
                report_md = gr.DownloadButton("Report (Markdown)", visible=False, elem_id="teach-report-md")
                report_sr = gr.DownloadButton("Report (DICOM SR)", visible=False, elem_id="teach-report-sr")
        export_button = gr.Button("Export the session (CSV and PDF)", elem_id="teach-export")
        with gr.Row():
            session_csv_button = gr.DownloadButton("Session (CSV)", visible=False, elem_id="teach-csv")
            session_pdf_button = gr.DownloadButton("Session handout (PDF)", visible=False, elem_id="teach-pdf")

        view_parts = [view, centre, width, measure]
        case_outputs = [*view_parts, model_view, case_info, reveal_box, student_score, model_score, chat,
                        indication, comparison, recommendation, report_md, report_sr, *form, state]  # fmt: skip
        open_button.click(open_case, [case_list, state], case_outputs, api_name="teaching_open_case")
        next_button.click(next_case, [state], [case_list, *case_outputs], api_name="teaching_next_case")
        shuffle_button.click(shuffle, [state], [case_list, order_note, state], api_name="teaching_shuffle")
        film_upload.upload(upload_film, [film_upload, state], case_outputs, api_name="teaching_upload_film")
        key_upload.upload(upload_key, [key_upload, state], [case_info, state], api_name="teaching_upload_key")
        view_io: dict[str, Any] = dict(inputs=[state], outputs=[*view_parts, state])
        for button, name in ((lung, "lung"), (mediastinum, "mediastinum"), (bone, "bone"), (file_window, "file")):
            button.click(preset(name), api_name=f"teaching_window_{name}", **view_io)
        invert_button.click(invert, api_name="teaching_invert", **view_io)
        zoom_in.click(zoom(2.0), api_name="teaching_zoom_in", **view_io)
        zoom_out.click(zoom(0.5), api_name="teaching_zoom_out", **view_io)
        reset_button.click(reset, api_name="teaching_reset", **view_io)
        centre.release(set_window, [centre, width, state], [*view_parts, state], api_name="teaching_window")
        width.release(set_window, [centre, width, state], [*view_parts, state], api_name=False)
        tool.change(set_tool, [tool, state], [*view_parts, state], api_name="teaching_tool")
        view.select(clicked, [state], [*view_parts, state], api_name=False)
        for handler in (reveal, ask, stop_answers):
            handler.__annotations__["request"] = gr.Request  # Gradio passes the request (its session) by type
        generation: dict[str, Any] = dict(
            concurrency_limit=settings.generation_concurrency, concurrency_id="generation"
        )
        reveal_button.click(
            reveal,
            [state, quiz, *form],
            [reveal_box, student_score, model_score, state],
            api_name="teaching_reveal",
            **generation,
        )
        ask_button.click(ask, [question, state], [chat, question, state], api_name="teaching_ask", **generation)
        question.submit(ask, [question, state], [chat, question, state], api_name=False, **generation)
        stop_button.click(stop_answers, None, None, api_name=False, queue=False)  # not cancels=: see answer_stops
        report_button.click(
            export_report,
            [state, indication, comparison, recommendation, identifiers],
            [report_md, report_sr],
            api_name="teaching_report",
        )
        export_button.click(
            export_session, [state], [session_csv_button, session_pdf_button], api_name="teaching_export"
        )
        projector.click(None, None, None, js=PROJECTOR_JS, api_name=False)
        page.load(list_cases, None, [case_list, library_note], js=SHORTCUT_JS, api_name="teaching_cases")
