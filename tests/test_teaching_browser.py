"""The teaching-rounds page (/teaching) in headless Chromium (Debian's, driven by Playwright), against a real
server with the demo model and a starter case library of labelled phantoms:

- a quiz round on three library cases in shuffled order: a read entered, reveal, the scores the labels give;
  then the session export (CSV rows and the PDF page rendered to PNG with pdftoppm) shows the three cases;
- window/level presets change the displayed pixels (buttons and keyboard shortcuts);
- the ruler reads a known distance on a phantom with known pixel spacing within 2%; the CTR calliper too;
- the viewer's OHIF habits: the Bone preset readable on the phantoms (mean grey 60-200), a right-button drag
  windows the film (live values, then new pixels), Enter applies a typed window, the pixel probe reads a known
  pixel's stored value, every tool has a key listed in the help (?), and the projector layout shows the whole film
  and the chat alone at 1920 x 1080;
- Stop cancels a running answer and frees its slot: with one decode slot, the next question starts while the
  stopped answer would still have been running (nothing has completed yet).
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize
from medgemma_xray.teaching.library import load_library, write_starter_set
from medgemma_xray.teaching.model_read import model_read
from medgemma_xray.teaching.scoring import read_from_labels, score_read
from medgemma_xray.web.teaching_keys import KEYS
from tests.conftest import ARTIFACTS, start_server
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.slow

CHECKBOXES = {
    "present.pleural_effusion": "read-effusion",
    "present.pneumothorax": "read-pneumothorax",
    "present.nodule_or_mass": "read-nodule",
    "present.consolidation": "read-consolidation",
    "present.cardiomegaly": "read-cardiomegaly",
    "present.endotracheal_tube": "read-ett",
    "present.central_line": "read-line",
    "present.pacemaker": "read-pacemaker",
}
CHOICES = {
    "effusion.side": "read-effusion-side",
    "effusion.size": "read-effusion-size",
    "pneumothorax.side": "read-pneumothorax-side",
    "pneumothorax.size": "read-pneumothorax-size",
    "nodule.lobe": "read-nodule-lobe",
    "consolidation.lobe": "read-consolidation-lobe",
    "central_line.route": "read-line-route",
    "central_line.tip": "read-line-tip",
    "pacemaker.side": "read-pacemaker-side",
    "technique.rotated": "read-rotated",
    "technique.inspiration": "read-inspiration",
    "technique.exposure": "read-exposure",
}
NUMBERS = {
    "cardiothoracic_ratio": "read-ctr",
    "nodule.size_cm": "read-nodule-size",
    "endotracheal_tube.tip_above_carina_cm": "read-ett-tip",
}
IDENTIFIERS = ("Synthetic^Phantom", "Synthetic Phantom", "SYNTHETIC-9", "SYN0001", "phantom_case_")


@pytest.fixture(scope="module")
def library_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("case-library")
    write_starter_set(folder, 8)
    return folder


@pytest.fixture(scope="module")
def teaching_server(tmp_path_factory, demo_model_dir, library_folder):
    server = start_server(tmp_path_factory.mktemp("teaching-logs"), env={"CASE_LIBRARY": str(library_folder)})
    yield server
    server.stop()


def _browser(playwright):
    if not shutil.which("chromium"):
        pytest.fail("Debian's chromium is not installed; run scripts/setup_env.sh --dev (apt-get install chromium)")
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def _open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
    page.goto(f"{url}/teaching", wait_until="load")
    page.wait_for_selector("#teach-library :text('cases in the library')", timeout=60_000)
    return page


def _choose(page, elem_id: str, value: str) -> None:
    page.click(f"#{elem_id} input")
    page.click(f"#{elem_id} li[role=option][aria-label='{value}']")


def _fill_read(page, read: dict) -> None:
    for name, elem_id in CHECKBOXES.items():
        if read.get(name):
            page.check(f"#{elem_id} input")
    if any(read.get(name) is False for name in CHECKBOXES):  # an unticked finding is absent only when said so
        page.check("#read-rest-absent input")
    for name, elem_id in CHOICES.items():
        value = read.get(name)
        if value is not None:
            _choose(page, elem_id, {True: "yes", False: "no"}.get(value, value) if isinstance(value, bool) else value)
    for name, elem_id in NUMBERS.items():
        if read.get(name) is not None:
            page.fill(f"#{elem_id} input", f"{read[name]:g}")


def _open_case(page, title: str) -> None:
    _choose(page, "teach-case", title)
    page.click("#teach-open")
    page.wait_for_selector(f"#teach-case-info :text('{title}')", timeout=60_000)
    page.wait_for_selector("#teach-measure :text('Ruler')", timeout=60_000)


def _view_pixels(page) -> np.ndarray:
    from PIL import Image

    source = page.get_attribute("#teach-view img", "src")
    body = page.request.get(source).body()
    return np.asarray(Image.open(io.BytesIO(body)).convert("L"), dtype=np.int16)


def _wait_new_view(page, before: str) -> None:
    page.wait_for_function(
        "(old) => { const i = document.querySelector('#teach-view img'); return i && i.src !== old && i.complete; }",
        arg=before,
        timeout=60_000,
    )


def _screen_point(page, row: float, col: float, shape: tuple[int, int]) -> tuple[float, float]:
    """Where a film pixel (row, col) of the whole-film view lies on the screen (the image is letterboxed)."""
    page.wait_for_function(
        "() => { const i = document.querySelector('#teach-view img'); return i && i.complete && i.naturalWidth > 0; }",
        timeout=60_000,
    )
    page.locator("#teach-view img").scroll_into_view_if_needed()
    box = page.locator("#teach-view img").bounding_box()
    natural = page.evaluate(
        "() => { const i = document.querySelector('#teach-view img'); return [i.naturalWidth, i.naturalHeight]; }"
    )
    scale = min(box["width"] / natural[0], box["height"] / natural[1])
    left = box["x"] + (box["width"] - natural[0] * scale) / 2
    top = box["y"] + (box["height"] - natural[1] * scale) / 2
    view_x = (col + 0.5) * natural[0] / shape[1]
    view_y = (row + 0.5) * natural[1] / shape[0]
    return left + view_x * scale, top + view_y * scale


def _click_and_wait(page, point: tuple[float, float], expected: str) -> None:
    """Click the view and wait for the measurement to say `expected` (a regular expression): one point at a
    time, as a person clicks."""
    page.mouse.click(*point)
    page.wait_for_function(
        "(pattern) => new RegExp(pattern).test(document.querySelector('#teach-measure').innerText)",
        arg=expected,
        timeout=60_000,
    )


def _report_text(page) -> str:
    return page.inner_text("#teach-reveal-box pre").strip()


STUDENT = "Ana Lopez"
DATED_NAME = r"^\d{4}-\d{2}-\d{2}_teaching-session-[0-9a-f]{4}_3-cases\.(csv|pdf)$"


def _disabled(page, selector: str) -> bool:
    return page.locator(selector).is_disabled()


def test_quiz_round_on_three_cases_then_export(teaching_server, library_folder, tmp_path):
    """Guess first: the questions are locked until Reveal and the read after it; the student is scored on the
    fields answered ("not assessed" for the rest); the exports are dated, named by the round, and carry the
    student's name and the date."""
    import datetime

    playwright_api = pytest.importorskip("playwright.sync_api")
    library = load_library(library_folder)
    by_title = {case.title: case for case in library.cases}
    ARTIFACTS.mkdir(exist_ok=True)
    expected = []
    today = datetime.date.today().isoformat()
    with playwright_api.sync_playwright() as playwright:
        browser = _browser(playwright)
        page = _open_page(browser, teaching_server.url)
        page.fill("#teach-student textarea, #teach-student input", STUDENT)
        assert today in page.inner_text("#teach-day")
        page.click("#teach-shuffle")
        page.wait_for_selector("#teach-order :text('Quiz order:')", timeout=60_000)
        order = page.inner_text("#teach-order").split("Quiz order:", 1)[1].strip().split(", ")
        assert sorted(order) == sorted(by_title), order
        for index, title in enumerate(order[:3]):
            page.click("#teach-next")
            page.wait_for_selector(f"#teach-case-info :text('{title}')", timeout=60_000)
            # The rest of the screen (an empty read, no report) follows the case's notes in a step of its own.
            page.wait_for_function("() => document.querySelector('#teach-reveal-box').innerText.trim() === ''")
            key = by_title[title].key
            if index == 0:  # the key itself: every field right
                read = read_from_labels(key)
            elif index == 1:  # the key with a ratio 0.15 off and the rotation the wrong way round
                read = read_from_labels(key)
                read["cardiothoracic_ratio"] = round(key.heart.cardiothoracic_ratio + 0.15, 2)
                read["technique.rotated"] = not key.technique.rotated
            else:  # nothing entered: every field not assessed, nothing scored
                read = {}
            # Before the reveal the Questions panel is locked in quiz mode (typing is refused too).
            page.wait_for_function("() => document.querySelector('#teach-ask').disabled")
            assert _disabled(page, "#teach-question textarea")
            assert "press Reveal first" in page.get_attribute("#teach-question textarea", "placeholder")
            assert not _disabled(page, "#read-effusion input")
            _fill_read(page, read)
            page.click("#teach-reveal")
            page.wait_for_selector("#teach-model-score :text('Model score')", timeout=180_000)
            student = score_read(read, key, answered_only=True)
            model = score_read(model_read(_report_text(page)), key)
            expected.append((title, student.summary(), model.summary()))
            assert f"Student score: {student.summary()}" in page.inner_text("#teach-student-score")
            assert STUDENT in page.inner_text("#teach-student-score") and today in page.inner_text(
                "#teach-student-score"
            )
            assert f"Model score: {model.summary()}" in page.inner_text("#teach-model-score")
            # After the reveal the read is locked and the questions open.
            page.wait_for_function("() => document.querySelector('#read-effusion input').disabled", timeout=60_000)
            assert _disabled(page, "#read-notes textarea") and _disabled(page, "#read-ctr input")
            page.wait_for_function("() => !document.querySelector('#teach-ask').disabled", timeout=60_000)
            if index == 0:
                assert student.right == student.total and student.not_assessed == 0
            if index == 1:
                assert student.total - student.right == 2
                assert not student.mark("cardiothoracic_ratio").right and not student.mark("technique.rotated").right
            if index == 2:  # an empty read scores nothing, and says so field by field
                assert student.total == 0 and "nothing answered" in page.inner_text("#teach-student-score")
                assert page.inner_text("#teach-reveal-box").count("not assessed") == student.not_assessed
            page.screenshot(path=str(ARTIFACTS / f"teaching_quiz_case{index + 1}.png"), full_page=True)

        page.click("#teach-export")
        page.wait_for_selector("#teach-csv:visible", timeout=60_000)
        with page.expect_download(timeout=60_000) as csv_download:
            page.click("#teach-csv")
        with page.expect_download(timeout=60_000) as pdf_download:
            page.click("#teach-pdf")
        csv_text = Path(csv_download.value.path()).read_text(encoding="utf-8")
        pdf_path = tmp_path / "session.pdf"
        shutil.copy(pdf_download.value.path(), pdf_path)
        names = (csv_download.value.suggested_filename, pdf_download.value.suggested_filename)
        browser.close()

    for name in names:
        assert re.match(DATED_NAME, name) and name.startswith(today), name
    assert STUDENT not in teaching_server.log_text, "the student's name reached the server's log"
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    assert [(r["title"], r["student_score"].split(" (")[0], r["model_score"].split(" (")[0]) for r in rows] == [
        (title, student.split(" (")[0], model) for title, student, model in expected
    ]
    assert {(r["student"], r["date"]) for r in rows} == {(STUDENT, today)}
    assert all(r["cardiothoracic ratio (key)"] for r in rows) and rows[2]["rotated (student)"] == "not assessed"
    rendered = ARTIFACTS / "teaching_session_handout"
    subprocess.run(["pdftoppm", "-png", "-r", "60", "-f", "1", "-l", "1", str(pdf_path), str(rendered)], check=True)
    page_png = next(ARTIFACTS.glob("teaching_session_handout*.png"))
    from PIL import Image

    pixels = np.asarray(Image.open(page_png).convert("L"))
    assert (pixels < 128).mean() > 0.01, "the handout's first page rendered blank"
    pdf_text = subprocess.run(["pdftotext", str(pdf_path), "-"], check=True, capture_output=True, text=True).stdout
    assert f"Student: {STUDENT}" in pdf_text and today in pdf_text
    for title, student_score, model_score in expected:
        assert title in pdf_text and f"Student {student_score}" in pdf_text and f"Model {model_score}" in pdf_text
    for exported in (csv_text, pdf_text):
        for identifier in IDENTIFIERS:
            assert identifier.lower() not in exported.lower(), identifier


def test_viewer_presets_ruler_and_calliper(teaching_server, library_folder):
    playwright_api = pytest.importorskip("playwright.sync_api")
    import pydicom

    case = next(c for c in load_library(library_folder).cases if c.film_path.suffix == ".dcm")
    dataset = pydicom.dcmread(case.film_path)
    shape, spacing = (int(dataset.Rows), int(dataset.Columns)), float(dataset.PixelSpacing[0])
    ARTIFACTS.mkdir(exist_ok=True)
    with playwright_api.sync_playwright() as playwright:
        browser = _browser(playwright)
        page = _open_page(browser, teaching_server.url)
        _open_case(page, case.title)
        views = {"file": _view_pixels(page)}
        for name, button in (("lung", "#teach-lung"), ("bone", "#teach-bone"), ("mediastinum", "#teach-mediastinum")):
            before = page.get_attribute("#teach-view img", "src")
            page.click(button)
            _wait_new_view(page, before)
            views[name] = _view_pixels(page)
        page.screenshot(path=str(ARTIFACTS / "teaching_viewer_mediastinum.png"), full_page=True)
        before = page.get_attribute("#teach-view img", "src")
        page.click("#teach-header")  # focus off any input: the keys ignore typing
        page.keyboard.press("1")
        _wait_new_view(page, before)
        views["key 1"] = _view_pixels(page)

        # The ruler: two points 300 rows apart on the whole-film view.
        before = page.get_attribute("#teach-view img", "src")
        page.keyboard.press("r")
        _wait_new_view(page, before)
        col = shape[1] / 2
        _click_and_wait(page, _screen_point(page, 100, col, shape), r"\(1 of 2\)")
        _click_and_wait(page, _screen_point(page, 400, col, shape), r"Ruler: [\d.]+ mm")
        ruler = page.inner_text("#teach-measure")
        page.screenshot(path=str(ARTIFACTS / "teaching_viewer_ruler.png"), full_page=True)

        # The CTR calliper: heart borders 120 columns apart, thorax margins 300 apart.
        page.click("#teach-tool label:has-text('CTR calliper')")
        page.wait_for_selector("#teach-measure :text('CTR calliper: click')", timeout=60_000)
        middle = shape[1] / 2
        columns = (middle - 60, middle + 60, middle - 150, middle + 150)
        for number, x in enumerate(columns, start=1):
            expected = "cardiothoracic ratio" if number == len(columns) else rf"\({number + 1} of 4\)"
            _click_and_wait(page, _screen_point(page, 300, x, shape), expected)
        calliper = page.inner_text("#teach-measure")
        page.screenshot(path=str(ARTIFACTS / "teaching_viewer_calliper.png"), full_page=True)

        # The projector layout (key P): the read form and the engineering rows fold away, the film grows.
        width_before = page.locator("#teach-view-col").bounding_box()["width"]
        page.click("#teach-header")
        page.keyboard.press("p")
        page.wait_for_selector(".teach-form", state="hidden", timeout=30_000)
        projector_width = page.locator("#teach-view-col").bounding_box()["width"]
        page.screenshot(path=str(ARTIFACTS / "teaching_projector.png"))
        browser.close()

    for name in ("lung", "bone", "mediastinum"):
        changed = np.abs(views[name] - views["file"]).mean()
        assert changed > 5, f"the {name} preset left the picture nearly as it was (mean change {changed:.1f})"
    assert np.abs(views["lung"] - views["bone"]).mean() > 5
    assert np.array_equal(views["key 1"], views["lung"]), "key 1 should show the lung window"
    known_mm = 300 * spacing
    read_mm = float(re.search(r"Ruler: ([\d.]+) mm", ruler).group(1))
    assert abs(read_mm - known_mm) <= 0.02 * known_mm, (ruler, known_mm)
    assert projector_width > 1.15 * width_before, (width_before, projector_width)
    ratio = float(re.search(r"cardiothoracic ratio ([\d.]+)", calliper).group(1))
    assert abs(ratio - 120 / 300) <= 0.02 * 0.4, calliper


KNOWN = (300, 200, 1234)  # row, column and stored value of a 9 x 9 block in the uploaded film


@pytest.fixture(scope="module")
def browser():  # one Chromium for the tests from here on: a second sync_playwright cannot start beside it
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as playwright:
        launched = _browser(playwright)
        yield launched
        launched.close()


def _level_width(page) -> tuple[float, float]:
    return float(page.input_value("#teach-level input")), float(page.input_value("#teach-width input"))


def _press(page, key: str) -> None:
    page.click("#teach-header")  # focus off any input: the keys ignore typing
    page.keyboard.press(key)


def test_the_bone_preset_is_readable_on_the_phantoms(browser, teaching_server, library_folder):
    cases = load_library(library_folder).cases
    page = _open_page(browser, teaching_server.url)
    means = {}
    for case in (
        next(c for c in cases if c.film_path.suffix == ".dcm"),
        next(c for c in cases if c.film_path.suffix == ".png"),
    ):
        _open_case(page, case.title)
        before = page.get_attribute("#teach-view img", "src")
        _press(page, "3")
        _wait_new_view(page, before)
        means[case.title] = float(_view_pixels(page).mean())
    page.screenshot(path=str(ARTIFACTS / "teaching_viewer_bone.png"))
    page.close()
    assert all(60 <= mean <= 200 for mean in means.values()), means


def test_a_right_drag_windows_the_film_and_enter_applies_a_typed_window(browser, teaching_server, library_folder):
    case = next(c for c in load_library(library_folder).cases if c.film_path.suffix == ".dcm")
    page = _open_page(browser, teaching_server.url)
    _open_case(page, case.title)
    start_values, start_pixels = _level_width(page), _view_pixels(page)
    page.locator("#teach-view img").scroll_into_view_if_needed()
    box = page.locator("#teach-view img").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    before = page.get_attribute("#teach-view img", "src")
    page.mouse.move(x, y)
    page.mouse.down(button="right")
    page.mouse.move(x + box["width"] * 0.2, y + box["height"] * 0.1, steps=5)
    live = page.inner_text("#teach-wl-live")  # shown while the button is held
    held_values = _level_width(page)
    page.mouse.up(button="right")
    _wait_new_view(page, before)
    page.wait_for_function("() => getComputedStyle(document.getElementById('teach-wl-live')).display === 'none'")
    dragged_values, dragged_pixels = _level_width(page), _view_pixels(page)
    assert re.fullmatch(r"W [\d.]+\s+L [\d.]+", live), live
    assert held_values != start_values and dragged_values[1] > start_values[1] * 1.2, (start_values, dragged_values)
    assert abs(dragged_values[0] - held_values[0]) < 1 and abs(dragged_values[1] - held_values[1]) < 1
    assert np.abs(dragged_pixels - start_pixels).mean() > 3, "the drag left the picture as it was"

    page.fill("#teach-level input", "1000")
    page.fill("#teach-width input", "800")
    before = page.get_attribute("#teach-view img", "src")
    page.press("#teach-width input", "Enter")
    _wait_new_view(page, before)
    typed = _view_pixels(page)
    assert _level_width(page) == (1000.0, 800.0)
    assert np.abs(typed - dragged_pixels).mean() > 3, "Enter did not apply the typed window"
    page.close()


def test_the_probe_reads_the_stored_value_of_a_known_pixel(browser, teaching_server, tmp_path):
    row, col, value = KNOWN
    stored = quantize(chest_phantom(seed=31), 12)
    stored[row - 4 : row + 5, col - 4 : col + 5] = value
    film = tmp_path / "probe-film.dcm"
    film.write_bytes(dicom_bytes(stored, bits_stored=12, window=(2048, 4096), pixel_spacing_mm=0.5))
    page = _open_page(browser, teaching_server.url)
    page.set_input_files("#teach-upload input[type=file]", str(film))
    page.wait_for_selector("#teach-case-info :text('Uploaded film')", timeout=60_000)
    page.wait_for_selector("#teach-measure :text('Ruler')", timeout=60_000)
    _press(page, "v")
    page.wait_for_selector("#teach-measure :text('Probe: click')", timeout=60_000)
    page.mouse.click(*_screen_point(page, row, col, stored.shape))
    page.wait_for_selector("#teach-measure :text('stored value')", timeout=60_000)
    reading = page.inner_text("#teach-measure")
    page.screenshot(path=str(ARTIFACTS / "teaching_viewer_probe.png"))
    page.close()
    assert f"stored value {value}," in reading, reading
    grey = round((value - (2048 - 4096 / 2)) * 255 / 4096 - 0.5)  # the file's window, as viewer.windowed rounds
    shown = int(re.search(r"displayed grey (\d+)", reading).group(1))
    assert abs(shown - grey) <= 1, reading


def test_every_tool_has_a_key_listed_in_the_help(browser, teaching_server, library_folder):
    page = _open_page(browser, teaching_server.url)
    _press(page, "?")
    page.wait_for_selector("#teach-help-box", state="visible", timeout=30_000)
    listed = page.inner_text("#teach-help-box")
    for _, (action, selector) in KEYS.items():
        assert action in listed, action
        assert page.locator(selector).count() == 1, selector  # the key clicks a control that exists
    for control in (
        "#teach-lung",
        "#teach-bone",
        "#teach-invert",
        "#teach-zoom-in",
        "#teach-reset",
        "#teach-projector",
    ):
        assert control in {selector for _, selector in KEYS.values()}, control
    page.keyboard.press("Escape")
    page.wait_for_selector("#teach-help-box", state="hidden", timeout=30_000)
    page.close()


def test_the_projector_layout_shows_the_whole_film_and_the_chat_at_1080p(browser, teaching_server, library_folder):
    case = load_library(library_folder).cases[0]
    context = browser.new_context(viewport={"width": 1920, "height": 1080})
    page = context.new_page()
    page.goto(f"{teaching_server.url}/teaching", wait_until="load")
    page.wait_for_selector("#teach-library :text('cases in the library')", timeout=60_000)
    _open_case(page, case.title)
    _press(page, "p")
    page.wait_for_selector("#teach-header", state="hidden", timeout=30_000)
    page.wait_for_function("() => document.body.classList.contains('projector')")
    page.wait_for_timeout(300)  # the layout settles (no request: a class on the page)
    film = page.evaluate(
        """() => { const i = document.querySelector('#teach-view img'); const r = i.getBoundingClientRect();
        const scale = Math.min(r.width / i.naturalWidth, r.height / i.naturalHeight);
        const w = i.naturalWidth * scale, h = i.naturalHeight * scale;
        return {top: r.top + (r.height - h) / 2, bottom: r.top + (r.height + h) / 2, height: h,
                left: r.left + (r.width - w) / 2, right: r.left + (r.width + w) / 2}; }"""
    )
    chat = page.locator("#teach-chat").bounding_box()
    page.screenshot(path=str(ARTIFACTS / "teaching_projector.png"))
    hidden = [s for s in ("#teach-tools", "#teach-model-view", "#teach-case-info", "#teach-reveal", "#teach-top")
              if page.locator(s).is_visible()]  # fmt: skip
    context.close()
    assert film["top"] >= 0 and film["bottom"] <= 1080 and film["left"] >= 0 and film["right"] <= 1920, film
    assert film["height"] > 0.85 * 1080, film  # the film fills the height
    assert chat is not None and chat["y"] >= 0 and chat["y"] + chat["height"] <= 1080, chat
    assert not hidden, f"the projector layout still shows {hidden}"


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


def _wait_slot_free(page, url: str) -> None:
    for _ in range(600):  # the scheduler drops a cancelled answer at its next turn
        if _metric(url, "medgemma_requests_running") == 0:
            return
        page.wait_for_timeout(100)
    raise AssertionError("Stop did not free the answer's slot")


ANSWER_TO_JS = """(question) => {
  const rows = [...document.querySelectorAll('#teach-chat .message-row')];
  const asked = rows.findIndex((r) => r.classList.contains('user-row') && r.innerText.includes(question));
  const answer = asked < 0 ? null : rows.slice(asked + 1).find((r) => r.classList.contains('bot-row'));
  return answer ? answer.innerText.trim() : '';
}"""


def _answer_to(page, question: str) -> str:
    """The chat's answer to this question ('' while none is shown): the bot row after the question's own row."""
    return page.evaluate(ANSWER_TO_JS, question)


def _wait_answer_to(page, question: str, predicate_js: str, timeout_ms: int = 300_000) -> None:
    page.wait_for_function(
        f"([q, js]) => {{ const text = ({ANSWER_TO_JS})(q); return (new Function('text', js))(text); }}",
        arg=[question, predicate_js],
        timeout=timeout_ms,
    )


def _long_answers_env(library_folder, random_model_dir, **extra: str) -> dict[str, str]:
    """One decode slot and answers that run to 2048 tokens (the random-weight demo never stops early). Each decode
    step takes at least 10 ms (tests/support/paced_server.py): an answer needs >= 20 s on any machine, so it cannot
    finish on its own before Stop is clicked, however fast the machine is."""
    return {
        "CASE_LIBRARY": str(library_folder),
        "MODEL_PATH": str(random_model_dir),
        "GENERATION_CONCURRENCY": "1",
        "MAX_NEW_TOKENS": "2048",
        "TEST_DECODE_PACE_S": "0.010",
        **extra,
    }


@pytest.fixture(scope="module")
def paced_teaching_server(tmp_path_factory, random_model_dir, library_folder):
    """One paced server for both Stop tests (one start, not two). Questions open before the reveal: the Stop test
    on a question is about the slot, not the quiz; Reveal works the same either way. Its stop is checked here,
    once both tests have stopped their answers: a stopped answer gives its lease back, so SIGTERM finds nothing
    running (an answer left open would run >= 20 s and outlast DRAIN_TIMEOUT_S)."""
    env = _long_answers_env(library_folder, random_model_dir, DRAIN_TIMEOUT_S="5", TEACHING_QUESTIONS_BEFORE_REVEAL="1")
    server = start_server(tmp_path_factory.mktemp("stop-logs"), env=env, script="tests/support/paced_server.py")
    yield server
    server.stop()
    assert "stopping anyway" not in server.log_text, "a stopped answer still held its lease at SIGTERM"
    assert "stopped" in server.log_text.splitlines()[-1], server.log_text[-2000:]


def test_stop_frees_the_slot_for_the_next_question(browser, paced_teaching_server, library_folder):
    """One decode slot and answers that run to 2048 tokens (the random-weight demo never stops early): after
    Stop, the stopped answer stays in the chat as far as it went, the slot empties, and the next question gets
    its own answer streaming while nothing has completed, so it did not wait for the stopped answer. Gradio's
    cancels= failed this now and then beside a busy core: the next question was taken and never answered."""
    # That the stopped answers gave their leases back (SIGTERM finds nothing running) is checked at the server's
    # stop, in paced_teaching_server.
    first, second = "Describe the findings.", "Is there a pleural effusion?"
    server = paced_teaching_server
    completed_before = _metric(server.url, "medgemma_requests_total")
    page = None
    try:
        page = _open_page(browser, server.url)
        _open_case(page, load_library(library_folder).cases[0].title)
        page.fill("#teach-question textarea", first)
        page.click("#teach-ask")
        _wait_answer_to(page, first, "return text.length > 10;")
        page.evaluate("() => document.getElementById('teach-stop').click()")  # the chat grows under it
        _wait_answer_to(page, first, "return text.includes('Stopped.');", timeout_ms=120_000)
        _wait_slot_free(page, server.url)
        stopped_answer = _answer_to(page, first)
        page.fill("#teach-question textarea", second)
        page.click("#teach-ask")
        _wait_answer_to(page, second, "return text.length > 10;", timeout_ms=120_000)
        completed = _metric(server.url, "medgemma_requests_total")
        kept_answer = _answer_to(page, first)
        page.evaluate("() => document.getElementById('teach-stop').click()")
        _wait_answer_to(page, second, "return text.includes('Stopped.');", timeout_ms=120_000)
        _wait_slot_free(page, server.url)
        page.screenshot(path=str(ARTIFACTS / "teaching_stop.png"), full_page=True, timeout=120_000)
    finally:
        if page is not None:
            page.close()
    assert completed == completed_before, "the second answer started only after the stopped one had run to its end"
    body = stopped_answer.replace("Stopped. Ask again or ask another question.", "").strip()
    assert len(body) > 10, stopped_answer
    assert body[:10] in kept_answer, "the stopped answer left the conversation when the next was asked"


def test_a_stopped_report_leaves_the_case_to_be_revealed(browser, paced_teaching_server, library_folder):
    """Stop during Reveal: the page says the report was stopped, the slot empties, and Reveal runs again (a part
    of a report is not the model's read, so the case is not scored on it)."""
    box = "() => document.querySelector('#teach-reveal-box').innerText"
    server = paced_teaching_server
    completed_before = _metric(server.url, "medgemma_requests_total")
    page = None
    try:
        page = _open_page(browser, server.url)
        _open_case(page, load_library(library_folder).cases[0].title)
        for _ in range(2):  # the second Reveal runs: the stopped one did not reveal the case
            page.click("#teach-reveal")
            page.wait_for_function(
                f"() => {{ const t = ({box})(); return t.includes('(streaming)') && t.length > 60; }}",
                timeout=300_000,
            )
            page.evaluate("() => document.getElementById('teach-stop').click()")
            page.wait_for_function(f"() => ({box})().includes('Stopped before the report')", timeout=120_000)
            _wait_slot_free(page, server.url)
        completed = _metric(server.url, "medgemma_requests_total")
        score = page.evaluate("() => document.querySelector('#teach-model-score')?.innerText || ''")
    finally:
        if page is not None:
            page.close()
    assert completed == completed_before, "a report ran to its end although Stop was pressed"
    assert "Model score" not in score, f"a stopped report was scored: {score!r}"


# --- pointing (web.teaching_marks) ------------------------------------------------------------------------------------
def _colour_count(pixels: np.ndarray, colour: tuple[int, int, int]) -> int:
    return int((pixels == np.array(colour, dtype=pixels.dtype)).all(axis=-1).sum())


def _view_rgb(page) -> np.ndarray:
    from PIL import Image

    body = page.request.get(page.get_attribute("#teach-view img", "src")).body()
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"), dtype=np.int16)


def _checkpoint_localises(model_dir: Path) -> bool:
    import json

    profile = json.loads((model_dir / "demo_checkpoint.json").read_text())
    return "localisation" in profile.get("capabilities", [])


@pytest.fixture(scope="module")
def pointing_server(request, tmp_path_factory, demo_model_dir, library_folder):
    """The demo checkpoint, its marker declaring that it localises, so the page asks the model Where?: it answers
    with boxes, or the page says it did not locate the finding. The retrained demo declares it itself: then this is
    the module's teaching server (the same checkpoint and library; one server start fewer)."""
    import json

    if _checkpoint_localises(demo_model_dir):
        yield request.getfixturevalue("teaching_server")
        return
    folder = tmp_path_factory.mktemp("localising-demo")
    for item in demo_model_dir.iterdir():
        if item.name != "demo_checkpoint.json":
            (folder / item.name).symlink_to(item.resolve())
    marker = json.loads((demo_model_dir / "demo_checkpoint.json").read_text())
    marker["capabilities"] = sorted({*marker.get("capabilities", []), "localisation"})
    (folder / "demo_checkpoint.json").write_text(json.dumps(marker))
    env = {"CASE_LIBRARY": str(library_folder), "MODEL_PATH": str(folder)}
    server = start_server(tmp_path_factory.mktemp("pointing-logs"), env=env)
    yield server
    server.stop()


def test_where_is_off_with_the_reason_when_the_checkpoint_does_not_localise(
    browser, teaching_server, library_folder, demo_model_dir
):
    page = _open_page(browser, teaching_server.url)
    _open_case(page, load_library(library_folder).cases[0].title)
    disabled, note = page.locator("#teach-where").is_disabled(), page.inner_text("#teach-where-note")
    page.close()
    if _checkpoint_localises(demo_model_dir):
        assert not disabled and note == "", note
    else:
        assert disabled and "does not localise findings" in note and "MedGemma 1.5" in note, note


AXE_SCOPE = ["#teach-tools", "#teach-overlays", "#teach-legend", "#teach-where-note", "#teach-mark-score"]


def _axe_on(page, selectors: list[str]) -> list[dict]:
    try:
        import axe_playwright_python as axe  # ships axe-core's axe.min.js (pinned in constraints.txt)
    except ImportError:
        pytest.fail("axe-core is not installed; run scripts/setup_env.sh --dev (the dev extra)")
    page.add_script_tag(content=(Path(axe.__file__).parent / "axe.min.js").read_text())
    result = page.evaluate(
        "async (s) => await axe.run({include: s.map((x) => [x])}, {resultTypes: ['violations']})", selectors
    )
    return [
        {"id": v["id"], "impact": v["impact"], "targets": [node["target"] for node in v["nodes"]][:5]}
        for v in result["violations"]
        if v["impact"] in ("critical", "serious")
    ]


def test_a_box_drawn_then_reveal_shows_the_overlays_and_the_pointing_score(browser, pointing_server, library_folder):
    """The student boxes the key's pleural effusion with the Mark tool (two clicks) before Reveal; after it the key
    region (sky blue) joins the student's box (orange) on the film, each switchable, and the pointing score shows
    the effusion scored on presence, side, zone and overlap with the tolerances. The model is asked Where? for each
    of the key's findings: its boxes are drawn, or the page says it did not locate one; Where? on a picked finding
    after the reveal answers the same way."""
    import pydicom

    from medgemma_xray.phantoms.regions import finding_regions
    from medgemma_xray.teaching.mark_scoring import score_marks, summary
    from medgemma_xray.teaching.marks import Mark
    from medgemma_xray.teaching.overlays import COLOURS

    cases = load_library(library_folder).cases
    case = next(c for c in cases if c.key.present("pleural_effusion") and c.film_path.suffix == ".dcm")
    dataset = pydicom.dcmread(case.film_path, stop_before_pixels=True)
    shape = (int(dataset.Rows), int(dataset.Columns))
    region = next(r for r in finding_regions(case.key, *shape) if r.finding == "pleural_effusion")
    page = _open_page(browser, pointing_server.url)
    _open_case(page, case.title)
    assert not page.locator("#teach-where").is_disabled()
    _press(page, "k")
    page.wait_for_selector("#teach-measure :text('Mark:')", timeout=30_000)
    _choose(page, "teach-mark-finding", "pleural effusion")
    before = _view_rgb(page)
    # Two opposite corners of the key's box, a little inside it (film pixels, row then column).
    top_left = (region.box.y0 * shape[0] + 2, region.box.x0 * shape[1] + 2)
    bottom_right = (region.box.y1 * shape[0] - 2, region.box.x1 * shape[1] - 2)
    _click_and_wait(page, _screen_point(page, *top_left, shape), "First corner placed")
    page.mouse.click(*_screen_point(page, *bottom_right, shape))
    page.wait_for_function("() => document.querySelector('#teach-legend').innerText.includes('Your marks')")
    page.wait_for_selector("#teach-mark-list :text('1. pleural effusion: box')", timeout=30_000)
    # A second mark, a point, listed and then removed: the list and the film keep only the box.
    page.locator("#teach-mark-shape").get_by_label("Point").check()
    page.mouse.click(*_screen_point(page, shape[0] * 0.2, shape[1] * 0.5, shape))
    page.wait_for_selector("#teach-mark-list :text('2. pleural effusion: point')", timeout=30_000)
    page.locator("#teach-mark-list label", has_text="2. pleural effusion").click()
    page.click("#teach-mark-remove")
    page.wait_for_function(
        "() => !document.querySelector('#teach-mark-list').innerText.includes('2. pleural')", timeout=30_000
    )
    marked = _view_rgb(page)
    assert _colour_count(before, COLOURS["student"]) == 0 and _colour_count(marked, COLOURS["student"]) > 100
    assert _colour_count(marked, COLOURS["key"]) == 0, "the key's region showed before the reveal"

    page.click("#teach-reveal")
    page.wait_for_selector("#teach-mark-score :text('Pointing score')", timeout=300_000)
    asked_all = "() => !document.querySelector('#teach-where-note').innerText.includes('Asking the model')"
    page.wait_for_function(asked_all, timeout=300_000)  # Where? for each of the key's findings
    page.wait_for_function("() => document.querySelector('#teach-legend').innerText.includes('Key region')")
    revealed = _view_rgb(page)
    score_text = page.inner_text("#teach-mark-score")
    legend = page.inner_text("#teach-legend")
    page.screenshot(path=str(ARTIFACTS / "teaching_pointing_revealed.png"), full_page=True)
    page.locator("#teach-view").screenshot(path=str(ARTIFACTS / "teaching_pointing_view.png"))
    violations = _axe_on(page, AXE_SCOPE)

    before_toggle = page.get_attribute("#teach-view img", "src")
    page.locator("#teach-overlays").get_by_label("Key region").uncheck()
    _wait_new_view(page, before_toggle)
    without_key = _view_rgb(page)
    note = page.inner_text("#teach-where-note")
    _choose(page, "teach-mark-finding", "nodule or mass")  # the key's other finding, asked by the button
    page.click("#teach-where")
    page.wait_for_selector("#teach-where-note :text('Asking the model where the nodule or mass is')", timeout=60_000)
    page.wait_for_function(asked_all, timeout=300_000)
    where_note, where_legend = page.inner_text("#teach-where-note"), page.inner_text("#teach-legend")
    page.close()

    assert _colour_count(revealed, COLOURS["key"]) > 100 and _colour_count(revealed, COLOURS["student"]) > 100
    assert _colour_count(without_key, COLOURS["key"]) == 0 and _colour_count(without_key, COLOURS["student"]) > 100
    # The page's score is the one the marks drawn give (the clicks land within a view pixel of the corners).
    drawn = Mark.box(
        "pleural_effusion",
        ((top_left[0] + 0.5) / shape[0], (top_left[1] + 0.5) / shape[1]),
        ((bottom_right[0] + 0.5) / shape[0], (bottom_right[1] + 0.5) / shape[1]),
    )
    expected = score_marks([drawn], case.key, finding_regions(case.key, *shape))
    assert f"you {summary(expected)}" in score_text, (summary(expected), score_text)
    effusion = next(s for s in expected if s.finding == "pleural_effusion")
    shown_iou = float(re.search(r"hit \(IoU ([\d.]+)\)", score_text).group(1))
    best = max(float(v) for v in re.findall(r"IoU ([\d.]+)", effusion.overlap.marked))
    assert effusion.presence.right and abs(shown_iou - best) <= 0.03, (shown_iou, effusion)
    assert "overlap" in score_text and "hit (IoU" in score_text and "IoU >= 0.3" in score_text, score_text
    assert "Model's boxes" in legend or "did not locate the pleural effusion" in note, (legend, note)
    assert "not asked" not in score_text and "the model " in score_text, score_text
    assert "box for the nodule or mass" in where_note or "did not locate the nodule or mass" in where_note, where_note
    if "box for the nodule or mass" in where_note:
        assert "Model's boxes" in where_legend, where_legend
    assert violations == [], violations
