"""The front door in headless Chromium (Debian's, driven by Playwright) on a paced server: each decode step takes at
least PACE_S (tests/support/paced_server.py) and the random-weight demo writes every one of MAX_NEW_TOKENS, so an
answer lasts at least 12 s on any machine and everything below happens while it streams.

- × and a new film while an answer streams: the old answer stops (its slot frees), never comes back, and the next
  answer and report are about the new film (its label in the export's name and metadata, its source in the notes).
- The Question box is cleared once, at submit; what is typed while an answer streams is kept; Ask while an answer
  runs is refused with a message, the text kept; Stop ends the answer; New case and a closed tab stop it too.
- axe-core finds no critical or serious rule on the first screen of / and /teaching, with a case open, and after
  an answer: with the pinned axe (axe-playwright-python's copy) and, separately, with the newest axe-core on the
  npm registry (skipped, with the reason, when the registry cannot be reached).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize
from medgemma_xray.teaching.library import load_library, write_starter_set
from tests.conftest import ARTIFACTS, start_server
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.slow

PACE_S = "0.03"
MAX_NEW_TOKENS = "400"
STREAMING = "() => { const b = document.querySelectorAll('#chat .bot'); return b.length > 0 && b[b.length - 1].innerText.trim().length > 10; }"
BOTS = "() => document.querySelectorAll('#chat .bot').length"
NPM_AXE = "https://registry.npmjs.org/axe-core/latest"


@pytest.fixture(scope="module")
def library_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("case-library")
    write_starter_set(folder, 2)
    return folder


@pytest.fixture(scope="module")
def paced(tmp_path_factory, random_model_dir, library_folder):
    env = {
        "MODEL_PATH": str(random_model_dir),
        "MAX_NEW_TOKENS": MAX_NEW_TOKENS,
        "TEST_DECODE_PACE_S": PACE_S,
        "CASE_LIBRARY": str(library_folder),
    }
    server = start_server(
        tmp_path_factory.mktemp("front-door-browser"), env=env, script="tests/support/paced_server.py"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not shutil.which("chromium"):
        pytest.fail("Debian's chromium is not installed; run scripts/setup_env.sh --dev (apt-get install chromium)")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def films(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("films")
    paths = {"old": folder / "old-film.dcm", "new": folder / "new-film.png"}
    paths["old"].write_bytes(dicom_bytes(quantize(chest_phantom(seed=21), 12), bits_stored=12, window=(2048, 4096)))
    paths["new"].write_bytes(png_bytes(quantize(chest_phantom(seed=22), 8)))
    return paths


def running(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("medgemma_requests_running")
    )


def wait_slot_free(page, url: str) -> None:
    for _ in range(1200):  # the scheduler drops a cancelled answer at its next turn
        if running(url) == 0:
            return
        page.wait_for_timeout(100)
    raise AssertionError("the answer still holds its decode slot")


def open_main(browser, url: str):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.goto(url, wait_until="load")
    page.wait_for_selector("#model-badge :text('Mode:')", timeout=60_000)
    return page


def upload(page, path: Path, source: str) -> None:
    page.set_input_files("#film-upload input[type=file]", str(path))
    page.wait_for_selector(f"#film-notes :text('Loaded: {source}')", timeout=60_000)
    page.wait_for_selector("#film-preview img", timeout=30_000)


def ask(page, question: str) -> None:
    page.fill("#question textarea", question)
    page.click("#ask")
    page.wait_for_function(STREAMING, timeout=120_000)


def test_a_new_film_while_an_answer_streams_stops_it_and_the_next_answer_is_about_the_new_film(browser, paced, films):
    page = open_main(browser, paced.url)
    upload(page, films["old"], "DICOM DX")
    ask(page, "Describe the old film in detail.")
    assert page.input_value("#question textarea") == "", "the Question box is cleared once, at submit"
    page.fill("#question textarea", "typed while it streams")
    page.click("#ask")  # a second Ask while the answer runs: refused with a message, the text kept
    page.wait_for_selector(".toast-body:has-text('still running')", timeout=60_000)
    assert page.input_value("#question textarea") == "typed while it streams"
    assert page.locator("#question .error").count() == 0, "the refusal left an error overlay on the Question box"
    assert page.evaluate(BOTS) == 1 and running(paced.url) == 1

    page.click("#film-upload button[aria-label='Clear']")  # × while the answer streams
    page.wait_for_selector("#film-preview img", state="detached", timeout=30_000)
    wait_slot_free(page, paced.url)  # the old answer stopped
    assert page.evaluate(BOTS) == 0
    upload(page, films["new"], "PNG 8-bit")
    assert page.evaluate(BOTS) == 0, "the old film's answer came back beside the new film"
    assert page.input_value("#question textarea") == "typed while it streams"

    ask(page, "Is there an effusion on the new film?")
    page.click("#stop")
    page.wait_for_function(
        "() => { const b = document.querySelectorAll('#chat .bot'); return b.length && b[b.length-1].innerText.includes('Stopped.'); }",
        timeout=120_000,
    )
    wait_slot_free(page, paced.url)
    chat = page.inner_text("#chat")
    assert page.locator("#chat .user").count() == 1 and "new film" in chat and "old film" not in chat, chat

    page.click("#report")
    page.wait_for_selector("#report-json", state="visible", timeout=300_000)
    with page.expect_download(timeout=60_000) as download_info:
        page.click("#report-json")
    download = download_info.value
    exported = json.loads(Path(download.path()).read_text())
    notes = page.inner_text("#film-notes")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "front_door_new_film.png"), full_page=True)
    page.context.close()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}_report-[0-9a-f]{4}_film-2\.json", download.suggested_filename)
    assert exported["metadata"]["film"] == "film-2" and exported["metadata"]["source"].startswith("PNG 8-bit")
    assert notes.startswith("Loaded: PNG 8-bit") and "DICOM DX" not in notes


@pytest.mark.parametrize("how", ["new case", "closed tab"])
def test_new_case_and_a_closed_tab_stop_the_running_answer(browser, paced, films, how):
    page = open_main(browser, paced.url)
    upload(page, films["old"], "DICOM DX")
    ask(page, "Describe the film in detail.")
    assert running(paced.url) == 1
    if how == "new case":
        page.click("#new-case")
        page.wait_for_function("() => document.querySelectorAll('#chat .bot').length === 0", timeout=30_000)
        wait_slot_free(page, paced.url)
        assert "Loaded:" not in page.inner_text("#film-notes")
        page.context.close()
    else:
        context = page.context
        watcher = context.new_page()
        page.close()
        wait_slot_free(watcher, paced.url)
        context.close()


# --- axe-core ---------------------------------------------------------------------------------------------------
def pinned_axe() -> str:
    try:
        import axe_playwright_python as axe  # ships axe-core's axe.min.js (pinned in constraints.txt)
    except ImportError:
        pytest.fail("axe-core is not installed; run scripts/setup_env.sh --dev (the dev extra)")
    return (Path(axe.__file__).parent / "axe.min.js").read_text()


def newest_axe() -> str:
    """axe-core's newest release from the npm registry, fetched now; skips with the reason when unreachable."""
    try:
        with urllib.request.urlopen(NPM_AXE, timeout=20) as reply:
            latest = json.loads(reply.read())
        with urllib.request.urlopen(latest["dist"]["tarball"], timeout=60) as reply:
            packed = reply.read()
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        pytest.skip(f"the npm registry could not be reached for the newest axe-core ({type(exc).__name__}: {exc})")
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as archive:
        member = archive.extractfile("package/axe.min.js")
        if member is None:
            pytest.fail(f"axe-core {latest.get('version')} from npm has no package/axe.min.js")
        return member.read().decode()


SETTLED = """() => !document.querySelector('.pending, .generating')
  && !document.getAnimations().some((a) => a instanceof CSSTransition)
  && [...document.querySelectorAll('button.gallery-item')].every((b) => b.innerText.trim().length > 0)"""


def violations(page, script: str) -> list[dict]:
    """axe-core's critical and serious rules on the page as a person sees it: once no event is updating it (Gradio
    dims outputs while an event runs), the dimmed outputs have faded back in (a fading text measures as low
    contrast), and the example questions have drawn their text."""
    page.wait_for_function(SETTLED, timeout=120_000)
    page.add_script_tag(content=script)
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {"id": v["id"], "impact": v["impact"], "targets": [node["target"] for node in v["nodes"]][:5]}
        for v in result["violations"]
        if v["impact"] in ("critical", "serious")
    ]


@pytest.mark.parametrize("axe_source", ["pinned", "newest from npm"])
def test_axe_core_finds_no_critical_or_serious_rule(browser, paced, films, library_folder, axe_source):
    script = pinned_axe() if axe_source == "pinned" else newest_axe()
    found: dict[str, list] = {}
    page = open_main(browser, paced.url)
    found["/ first screen"] = violations(page, script)
    upload(page, films["old"], "DICOM DX")
    found["/ with a film"] = violations(page, script)
    ask(page, "Is there an effusion?")
    page.click("#stop")
    page.wait_for_selector("#ask:not([disabled])", timeout=60_000)
    page.wait_for_function("() => document.querySelector('#chat .bot').innerText.includes('Stopped.')", timeout=120_000)
    found["/ after an answer"] = violations(page, script)
    page.context.close()

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(f"{paced.url}/teaching", wait_until="load")
    page.wait_for_selector("#teach-library :text('cases in the library')", timeout=60_000)
    found["/teaching first screen"] = violations(page, script)
    title = load_library(library_folder).cases[0].title
    page.click("#teach-case input")
    page.click(f"ul[role='listbox'] li:has-text('{title}')")
    page.click("#teach-open")
    page.wait_for_selector(f"#teach-case-info :text('{title}')", timeout=120_000)
    page.wait_for_selector("#teach-view img", timeout=60_000)
    found["/teaching with a case open"] = violations(page, script)  # quiz mode: the questions locked till Reveal
    page.click("#teach-quiz input")  # a discussion round: the questions open at once
    page.wait_for_selector("#teach-question textarea:not([disabled])", timeout=60_000)
    page.fill("#teach-question textarea", "Is there an effusion?")
    page.click("#teach-ask")
    page.wait_for_function(
        "() => { const b = document.querySelectorAll('#teach-chat .bot'); return b.length && b[0].innerText.trim().length > 10; }",
        timeout=120_000,
    )
    page.click("#teach-stop")
    page.wait_for_function(
        "() => document.querySelector('#teach-chat .bot').innerText.includes('Stopped.')", timeout=120_000
    )
    found["/teaching after an answer"] = violations(page, script)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "front_door_teaching_axe.png"), full_page=True)
    context.close()
    assert all(not rules for rules in found.values()), {where: rules for where, rules in found.items() if rules}


def test_teaching_shows_film_warnings_in_the_notes_and_no_dead_controls(browser, paced, films):
    """A PNG case: "No DICOM header" is in the case's notes, not a toast; no Share button ("Must be on Spaces")."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(f"{paced.url}/teaching", wait_until="load")
    page.wait_for_selector("#teach-library :text('cases in the library')", timeout=60_000)
    page.set_input_files("#teach-upload input[type=file]", str(films["new"]))
    page.wait_for_selector("#teach-case-info :text('Uploaded film 1')", timeout=120_000)
    page.wait_for_selector("#teach-view img", timeout=60_000)
    info = page.inner_text("#teach-case-info")
    toasts = page.locator(".toast-body").all_inner_texts()
    share = page.locator("button[aria-label*='share' i], button[title*='share' i]").count()
    context.close()
    assert "No DICOM header" in info and toasts == [], (info, toasts)
    assert share == 0


def test_a_refused_film_on_teaching_marks_no_input(browser, paced, tmp_path):
    """A film the check refuses: a toast says why, and no input (the read form, the report's fields, the level and
    width sliders) carries the red error overlay."""
    from medgemma_xray.film_check.negatives import negative_film

    noise = tmp_path / "noise.png"
    noise.write_bytes(png_bytes(quantize(negative_film("noise", seed=5), 8)))
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(f"{paced.url}/teaching", wait_until="load")
    page.wait_for_selector("#teach-library :text('cases in the library')", timeout=60_000)
    page.set_input_files("#teach-upload input[type=file]", str(noise))
    page.wait_for_selector(".toast-body:has-text('does not look like a frontal chest X-ray')", timeout=120_000)
    marked = page.evaluate(
        "() => [...document.querySelectorAll('.error')].map((e) => e.closest('[id]')?.id).filter(Boolean)"
    )
    context.close()
    named_inputs = {"teach-indication", "teach-comparison", "teach-recommendation", "teach-level", "teach-width",
                    "teach-question", "teach-case", "teach-tool", "teach-quiz", "teach-upload", "teach-key"}  # fmt: skip
    inputs = [name for name in marked if name.startswith("read-") or name in named_inputs]
    assert inputs == [], marked
