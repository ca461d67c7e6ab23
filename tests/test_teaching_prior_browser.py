"""The prior film and "Practise my misses" on /teaching, in headless Chromium (Playwright) against a real server
on the demo model and a starter library with follow-up cases (progression pairs):

- a follow-up case shows the prior (left, labelled with its interval) and the current film (right); one typed
  level changes both halves' pixels, each by the single film's window;
- a quiz round on it: the student's change read is scored against the pair's change key at Reveal, and "What
  changed since the prior?" asks the model with both films (the demo checkpoint copied with the "longitudinal"
  capability declared, so the two-image path runs end to end; its words mean nothing) and shows its statement
  beside the read;
- a missed finding is remembered for the student (0600 file, their typed name only) and "Practise my misses"
  orders the library cases that show it, not the one just seen;
- a corrupt practice file is refused with what to do; a teacher's prior for an uploaded film goes beside it.
(Without the capability the control is disabled: tests/test_teaching_compare_controls.py.)
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client, handle_file

from medgemma_xray.phantoms.findings import FINDINGS
from medgemma_xray.teaching.library import load_library, write_starter_set
from medgemma_xray.teaching.paired_view import BAND_PX, GAP_PX
from medgemma_xray.teaching.practice import MEMORY_FILE, practice_case_ids
from tests.conftest import ARTIFACTS, start_server
from tests.test_teaching_browser import CHECKBOXES, _browser, _choose, _open_case, _open_page, _view_pixels

pytestmark = pytest.mark.slow
STUDENT = "Ana Practice"


@pytest.fixture(scope="module")
def library_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("case-library")
    write_starter_set(folder, 6, pairs=3)
    return folder


@pytest.fixture(scope="module")
def longitudinal_model(tmp_path_factory, demo_model_dir) -> Path:
    """The demo checkpoint with "longitudinal" declared in its marker (its other files linked, not copied): the
    two-film path runs whichever demo checkpoint is installed."""
    folder = tmp_path_factory.mktemp("demo-longitudinal")
    for path in demo_model_dir.iterdir():
        if path.name != "demo_checkpoint.json":
            (folder / path.name).symlink_to(path.resolve())
    marker = json.loads((demo_model_dir / "demo_checkpoint.json").read_text())
    declared = sorted({*marker.get("capabilities", ()), "longitudinal"})  # the retrained demo has it already
    (folder / "demo_checkpoint.json").write_text(json.dumps({**marker, "capabilities": declared}))
    return folder


@pytest.fixture(scope="module")
def prior_server(tmp_path_factory, library_folder, longitudinal_model):
    logs = tmp_path_factory.mktemp("prior-logs")
    server = start_server(logs, env={"CASE_LIBRARY": str(library_folder), "MODEL_PATH": str(longitudinal_model)})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as playwright:
        launched = _browser(playwright)
        yield launched
        launched.close()


def _halves(picture: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The prior's and the current film's pixels (a pair's films have one size: two equal halves, GAP_PX apart)."""
    half = (picture.shape[1] - GAP_PX) // 2
    films = picture[:-BAND_PX]
    return films[:, :half], films[:, half + GAP_PX :]


def _new_view(page, before: str) -> np.ndarray:
    page.wait_for_function(
        "(old) => { const i = document.querySelector('#teach-view img'); return i && i.src !== old && i.complete; }",
        arg=before,
        timeout=60_000,
    )
    return _view_pixels(page)


def test_the_prior_is_beside_the_film_and_one_level_changes_both(browser, prior_server, library_folder):
    case = next(c for c in load_library(library_folder).cases if c.prior is not None)
    page = _open_page(browser, prior_server.url)
    _open_case(page, case.title)
    page.wait_for_selector("#teach-measure :text('Side by side')", timeout=60_000)
    start = _view_pixels(page)
    prior, current = _halves(start)
    assert prior.shape == current.shape and start.shape[1] > start.shape[0]  # two films across
    assert start[-BAND_PX:].max() > 200  # the labels' text
    assert prior.mean() > 20 and current.mean() > 20  # both films drawn, not a blank half
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#teach-main-row").screenshot(path=str(ARTIFACTS / "teaching_prior_side_by_side.png"))
    before = page.get_attribute("#teach-view img", "src")
    level = float(page.input_value("#teach-level input"))
    page.fill("#teach-level input", f"{level * 1.6:g}")  # a higher level: both films darker
    page.press("#teach-level input", "Enter")
    after = _new_view(page, before)
    for old, new in zip(_halves(start), _halves(after), strict=True):
        assert float(old.mean()) - float(new.mean()) > 15, (old.mean(), new.mean())
    page.close()


def _ask_what_changed(page) -> None:
    """Press What changed? until it is taken: after the reveal the page may still be locating the key's findings
    ("Where?", one answer at a time per case: "still running"), then wait for the statement in place of "press
    What changed? to ask it"."""
    state = "busy"
    for _ in range(60):
        page.click("#teach-compare")
        state = page.wait_for_function(
            """() => {
                const t = document.querySelector('#teach-change-box').innerText;
                if (t.includes('The model on what changed: ') && !t.includes('to ask it')) return 'done';
                const busy = Array.from(document.querySelectorAll('.toast-body'))
                    .some(toast => toast.innerText.includes('still running'));
                return busy ? 'busy' : false;
            }""",
            timeout=300_000,
        ).json_value()
        if state == "done":
            return
        for close in page.locator(".toast-close").all():  # the refusal stays until closed
            close.click()
        page.wait_for_timeout(2000)
    raise AssertionError(f"What changed? was not taken: {state}")


def _wait_revealed(page) -> None:
    page.wait_for_selector("#teach-student-score :text('Student score')", timeout=300_000)


def test_the_change_read_is_scored_and_the_model_asked_what_changed(browser, prior_server, library_folder):
    case = next(c for c in load_library(library_folder).cases if c.prior is not None and c.prior.changes)
    change = case.prior.changes[0]
    page = _open_page(browser, prior_server.url)
    _open_case(page, case.title)
    page.wait_for_selector("#teach-change-read", state="visible", timeout=60_000)
    assert page.locator("#teach-compare").is_visible()
    _choose(page, f"change-{change.finding.replace('_', '-')}", change.kind)
    _choose(page, "change-pacemaker", "appeared")  # a change that is not there
    page.click("#teach-reveal")
    _wait_revealed(page)
    table = page.inner_text("#teach-change-box")
    assert "Student: 1/2." in table and "appeared (wrong)" in table, table
    _ask_what_changed(page)
    answered = page.inner_text("#teach-change-box")
    assert "Student: 1/2." in answered and "Model" in answered, answered  # the table has the model's column
    page.locator("#teach-change-box").screenshot(path=str(ARTIFACTS / "teaching_prior_change_read.png"))
    page.close()


def _read_all_but(page, key, missed: str) -> None:
    """A read that states every finding of the key right except `missed` (left unticked, so called absent)."""
    for finding in FINDINGS:
        if finding != missed and key.present(finding):
            page.check(f"#{CHECKBOXES[f'present.{finding}']} input")
    page.check("#read-rest-absent input")


def test_practise_my_misses_orders_new_cases_with_the_missed_finding(browser, prior_server, library_folder):
    cases = load_library(library_folder).cases
    with_effusion = [c for c in cases if c.key is not None and c.key.present("pleural_effusion")]
    assert len(with_effusion) >= 3, [c.title for c in cases]  # the starter set has them: grown effusions
    seen = next(c for c in with_effusion if c.prior is None)
    page = _open_page(browser, prior_server.url)
    page.fill("#teach-student textarea, #teach-student input", STUDENT)
    _open_case(page, seen.title)
    _read_all_but(page, seen.key, "pleural_effusion")
    page.click("#teach-reveal")
    _wait_revealed(page)
    page.wait_for_selector("#teach-change-box :text('Remembered for')", timeout=60_000)
    assert "pleural effusion" in page.inner_text("#teach-change-box")
    memory = prior_server.log_dir / MEMORY_FILE
    assert stat.S_IMODE(memory.stat().st_mode) == 0o600
    students = json.loads(memory.read_text())["students"]
    assert STUDENT in students and set(students) <= {"", STUDENT}  # the typed name (or none) only
    assert list(students[STUDENT]) == ["pleural_effusion"] and seen.title not in memory.read_text()
    page.click("#teach-practise")
    page.wait_for_selector("#teach-order :text('Practice round')", timeout=60_000)
    note = page.inner_text("#teach-order")
    shows = [(c.case_id, frozenset({"pleural_effusion"} & {f for f in FINDINGS if c.key.present(f)})) for c in cases]
    expected = [
        next(c.title for c in cases if c.case_id == i)
        for i in practice_case_ids(["pleural_effusion"], shows, [seen.case_id])
    ]
    listed = note.split(": ", 1)[1].split(". Open", 1)[0].split(", ")
    assert listed == expected and seen.title not in listed, (note, expected)
    assert all(next(c for c in cases if c.title == t).key.present("pleural_effusion") for t in listed)
    page.click("#teach-open")
    page.wait_for_selector(f"#teach-case-info :text('{listed[0]}')", timeout=60_000)
    page.close()


def test_a_corrupt_practice_file_is_refused_with_what_to_do(prior_server):
    memory = prior_server.log_dir / MEMORY_FILE
    kept = memory.read_bytes() if memory.exists() else None
    memory.write_text("{broken")
    try:
        client = Client(prior_server.url, verbose=False)
        with pytest.raises(Exception, match="delete teaching-practice.json"):
            client.predict(STUDENT, api_name="/teaching_practise")
        assert memory.read_text() == "{broken"
    finally:
        memory.write_bytes(kept) if kept is not None else memory.unlink()


def test_a_teacher_uploads_a_prior_for_an_uploaded_film_and_not_for_a_library_case(prior_server, tmp_path):
    from PIL import Image

    from medgemma_xray.phantoms.films import png_bytes, quantize
    from medgemma_xray.phantoms.progression import progression_pair

    pair = progression_pair(7, kind="nodule_appeared")
    film, prior = tmp_path / "Doe_Jane_today.png", tmp_path / "Doe_Jane_last_year.png"
    film.write_bytes(png_bytes(quantize(pair.current.film, 8)))
    prior.write_bytes(png_bytes(quantize(pair.prior.film, 8)))
    client = Client(prior_server.url, verbose=False)
    client.predict(api_name="/teaching_cases")  # the page's load: the library's choices
    client.predict("phantom_case_900000", api_name="/teaching_open_case")
    with pytest.raises(Exception, match="A library case's prior comes from its sidecar"):
        client.predict(handle_file(str(prior)), api_name="/teaching_upload_prior")
    client.predict(handle_file(str(film)), api_name="/teaching_upload_film")
    view, _, _, measure, *_ = client.predict(handle_file(str(prior)), api_name="/teaching_upload_prior")
    picture = np.asarray(Image.open(view).convert("L"))
    assert picture.shape[1] > 1.5 * picture.shape[0] and "Side by side" in measure
    prior_half, current_half = _halves(picture)
    assert np.abs(prior_half.astype(int) - current_half.astype(int)).mean() > 1  # two films, not one twice
