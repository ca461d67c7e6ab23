"""The screen shows the state the model answers from, in headless Chromium (Debian's, driven
by Playwright) against a real server on the demo model: failed and cleared uploads leave no film active, clearing
the chat starts a new conversation (the backend reuses 0 cached tokens), report exports have distinct names,
axe-core finds no critical or serious violation, no dead controls, warnings once, and on a phone the answer is in
view after it streams."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from medgemma_xray.phantoms.films import dicom_bytes, quantize
from medgemma_xray.phantoms.labelled import labelled_phantom
from tests.conftest import ARTIFACTS
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.slow

ANSWER_DONE = """
(count) => {
  const ask = document.querySelector('#ask');
  const answers = document.querySelectorAll('#chat .bot');
  return ask && !ask.disabled && answers.length >= count
    && answers[answers.length - 1].querySelector('details.answer-details, :scope *') !== null
    && (answers[answers.length - 1].textContent || '').includes('tokens');
}
"""
# True when el's box is inside every scrolling ancestor's box and inside the window: what a person can see.
IN_VIEW = """
(el) => {
  const rect = el.getBoundingClientRect();
  if (rect.height === 0) return false;
  for (let box = el.parentElement; box; box = box.parentElement) {
    const style = getComputedStyle(box);
    if (/(auto|scroll|hidden)/.test(style.overflowY)) {
      const outer = box.getBoundingClientRect();
      if (rect.top < outer.top - 1 || rect.top > outer.bottom - 8) return false;
    }
  }
  return rect.top >= 0 && rect.top < window.innerHeight - 8;
}
"""


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
    stored = quantize(labelled_phantom(0).film, 12)  # held out from the demo's training
    paths = {
        "pa": folder / "chest.dcm",
        "ap": folder / "chest-ap.dcm",
        "text": folder / "notes.png",  # a text file renamed .png
    }
    paths["pa"].write_bytes(dicom_bytes(stored, bits_stored=12, window=(2048, 4096)))
    paths["ap"].write_bytes(dicom_bytes(stored, bits_stored=12, window=(2048, 4096), view_position="AP"))
    paths["text"].write_text("this is not an image\n" * 20)
    return paths


def open_page(browser, server, width: int = 1400, height: int = 1000):
    context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    page = context.new_page()
    page.goto(server.url, wait_until="load")
    page.wait_for_selector("#model-badge :text('Mode:')", timeout=60_000)
    return page


def upload(page, path: Path) -> None:
    page.set_input_files("#film-upload input[type=file]", str(path))
    page.wait_for_selector("#film-notes :text('Loaded:')", timeout=60_000)
    page.wait_for_selector("#film-preview img", timeout=30_000)


NOTES_WITHOUT_A_FILM = "() => !document.querySelector('#film-notes').innerText.includes('Loaded:')"


def answers(page) -> int:
    return page.locator("#chat .bot").count()


def ask(page, question: str):
    """Ask and wait until the answer has streamed and its details line is there. Returns the answer's locator."""
    before = answers(page)
    page.fill("#question textarea", question)
    page.click("#ask")
    page.wait_for_function(ANSWER_DONE, arg=before + 1, timeout=180_000)
    return page.locator("#chat .bot").last


REFUSED_OR_ANSWERED = """
([count, expected]) => Array.from(document.querySelectorAll('.toast-body')).some(t => t.innerText.includes(expected))
  || document.querySelectorAll('#chat .bot').length > count
"""


def ask_expecting_refusal(page, question: str, expected: str = "Upload a chest X-ray first") -> None:
    """Ask; wait for either the expected error toast or a new answer, and fail if an answer came."""
    before = answers(page)
    page.fill("#question textarea", question)
    page.click("#ask")
    page.wait_for_function(REFUSED_OR_ANSWERED, arg=[before, expected], timeout=120_000)
    assert answers(page) == before, "the model answered although no film is active: " + page.inner_text("#chat")


def test_failed_upload_leaves_no_film_and_questions_are_refused(browser, demo_server, films):
    page = open_page(browser, demo_server)
    upload(page, films["pa"])
    ask(page, "Is there a pleural effusion?")
    # With a film loaded the box shows the file's chip; a person removes it to drop the next file.
    page.click("#film-upload button[aria-label='Clear']")
    page.set_input_files("#film-upload input[type=file]", str(films["text"]))
    page.wait_for_selector(".toast-body:has-text('not a PNG, JPEG or DICOM')", timeout=60_000)
    assert page.locator("#film-preview img").count() == 0, "the old film's preview is still shown"
    assert "Loaded:" not in page.inner_text("#film-notes")
    assert answers(page) == 0, "the old film's conversation is still shown"
    ask_expecting_refusal(page, "Is there a pleural effusion?")
    page.context.close()


def test_clearing_the_upload_clears_the_case(browser, demo_server, films):
    page = open_page(browser, demo_server)
    upload(page, films["pa"])
    ask(page, "Is there a pleural effusion?")
    page.click("#film-upload button[aria-label='Clear']")
    page.wait_for_selector("#film-preview img", state="detached", timeout=30_000)
    page.wait_for_function("() => document.querySelectorAll('#chat .bot').length === 0", timeout=30_000)
    ask_expecting_refusal(page, "And the heart size?")
    upload(page, films["pa"])  # the same film again: nothing of the cleared conversation's KV is reused
    again = ask(page, "Is there a pleural effusion?").text_content() or ""
    assert " 0 reused from this conversation's cache" in again and answers(page) == 1, again
    page.context.close()


def test_clearing_the_chat_starts_a_new_conversation(browser, demo_server, films):
    page = open_page(browser, demo_server)
    upload(page, films["pa"])
    ask(page, "Is there a pleural effusion?")
    follow_up = ask(page, "Is there a pneumothorax?").text_content()
    reused = re.search(r"(\d+) reused from this conversation's cache", follow_up or "")
    assert reused and int(reused.group(1)) > 256, f"the follow-up should reuse the film's cached KV: {follow_up}"
    page.click("#chat button[aria-label='Clear']")
    page.wait_for_function("() => document.querySelectorAll('#chat .bot').length === 0", timeout=30_000)
    fresh = ask(page, "Is there a pneumothorax?").text_content() or ""
    assert answers(page) == 1 and page.locator("#chat .user").count() == 1, page.inner_text("#chat")
    assert "prompt " in fresh and " 0 reused from this conversation's cache" in fresh, fresh
    page.context.close()


def report_download(page):
    page.click("#report")
    page.wait_for_selector("#report-json", state="hidden", timeout=60_000)  # hidden while the report streams
    page.wait_for_selector("#report-json", state="visible", timeout=180_000)
    with page.expect_download(timeout=60_000) as download_info:
        page.click("#report-json")
    download = download_info.value
    return download.suggested_filename, json.loads(Path(download.path()).read_text())


def test_report_exports_are_named_per_report(browser, demo_server, films):
    page = open_page(browser, demo_server)
    upload(page, films["pa"])
    first_name, first = report_download(page)
    assert page.locator("#report-box").is_visible(), "the report is not where the user looks"
    second_name, second = report_download(page)
    page.context.close()
    assert first_name != second_name, first_name
    for name, exported in ((first_name, first), (second_name, second)):
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}_report-[0-9a-f]{4}_film-1\.json", name), name
        metadata = exported["metadata"]
        assert name == f"{name[:10]}_report-{metadata['report_id']}_{metadata['film']}.json"
        for key in ("generated_tokens", "prompt_tokens"):
            assert isinstance(metadata[key], int) and metadata[key] > 0, metadata
        for key in ("seconds", "tokens_per_second", "confidence"):
            assert isinstance(metadata[key], float) and metadata[key] > 0, metadata
        assert 0 < metadata["confidence"] <= 1


def axe_violations(page) -> list[dict]:
    try:
        import axe_playwright_python as axe  # ships axe-core's axe.min.js (pinned in constraints.txt)
    except ImportError:
        pytest.fail("axe-core is not installed; run scripts/setup_env.sh --dev (the dev extra)")
    page.add_script_tag(content=(Path(axe.__file__).parent / "axe.min.js").read_text())
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {"id": v["id"], "impact": v["impact"], "targets": [node["target"] for node in v["nodes"]][:5]}
        for v in result["violations"]
        if v["impact"] in ("critical", "serious")
    ]


def test_axe_core_finds_no_critical_or_serious_violation(browser, demo_server, films):
    page = open_page(browser, demo_server)
    upload(page, films["pa"])
    ask(page, "Is there a pleural effusion?")
    with_answer = axe_violations(page)
    page.click("#report")
    page.wait_for_selector("#report-json", state="visible", timeout=180_000)
    with_report = axe_violations(page)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_case_report.png"), full_page=True)
    page.context.close()
    assert with_answer == [] and with_report == [], (with_answer, with_report)


def test_no_dead_controls_and_each_warning_once(browser, demo_server, films):
    page = open_page(browser, demo_server)
    upload(page, films["ap"])
    page.click("#film-upload button[aria-label='Clear']")
    # The clear's own event empties the notes; until then they still say "Loaded:", which upload() waits for.
    page.wait_for_function(NOTES_WITHOUT_A_FILM, timeout=60_000)
    upload(page, films["ap"])  # a repeated upload must not stack the warning
    notes = page.inner_text("#film-notes")
    assert notes.count("View position is AP") == 1, notes
    assert "demo model" in notes and "MedGemma was trained" not in notes, notes  # names the model loaded
    assert page.locator(".toast-body").count() == 0, "the warning is also shown as a toast"
    ask(page, "Is there a pleural effusion?")
    assert page.locator("#film-upload a[href]:visible").count() == 0, "the upload chip links to a deleted file"
    share = page.locator("button[aria-label*='share' i], button[title*='share' i]")
    assert share.count() == 0, [share.nth(i).get_attribute("aria-label") for i in range(share.count())]
    page.context.close()


def test_on_a_phone_the_answer_is_in_view_after_it_streams(browser, demo_server, films):
    page = open_page(browser, demo_server, width=390, height=844)
    upload(page, films["pa"])
    answer = ask(page, "Is there a pleural effusion?")
    first_line = answer.locator("p").first
    page.wait_for_function(IN_VIEW, arg=first_line.element_handle(), timeout=10_000)
    details = answer.locator("details.answer-details")
    assert details.count() == 1 and details.get_attribute("open") is None, "the details should be folded"
    summary = details.locator("summary")
    assert re.fullmatch(
        r"confidence \d+%( · cut off at the token limit)? · [\d.]+ s · \d+ tokens", summary.inner_text().strip()
    ), summary.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_case_phone.png"))
    summary.click()
    assert "not the probability that the answer is right" in details.inner_text()
    page.context.close()
