"""The page in headless Chromium (Debian's, driven by Playwright): upload a labelled phantom with a known finding,
ask about it, watch the answer stream, see its confidence, write a structured report and download its JSON export."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from medgemma_xray.assistant.report_schema import REPORT_FIELDS
from medgemma_xray.phantoms.films import dicom_bytes, quantize
from medgemma_xray.phantoms.labelled import labelled_phantom
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

COUNT_CHAT_MUTATIONS = """
() => {
  window.__chatMutations = 0;
  const chat = document.querySelector('#chat');
  new MutationObserver(() => { window.__chatMutations += 1; })
    .observe(chat, {subtree: true, childList: true, characterData: true});
}
"""


def test_upload_ask_and_see_the_streamed_answer(demo_server, tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not shutil.which("chromium"):
        pytest.fail("Debian's chromium is not installed; run scripts/setup_env.sh --dev (apt-get install chromium)")
    phantom = labelled_phantom(0)  # held out from training: a moderate right effusion, a left pneumothorax, a mass
    assert phantom.labels.effusion.side == "right" and phantom.labels.effusion.size == "moderate"
    film = tmp_path / "chest.dcm"
    film.write_bytes(dicom_bytes(quantize(phantom.film, 12), bits_stored=12, window=(2048, 4096)))
    ARTIFACTS.mkdir(exist_ok=True)

    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(demo_server.url, wait_until="load")
        page.wait_for_selector("#model-badge :text('Mode:')", timeout=60_000)
        assert "Trained on synthetic phantoms only; not a medical model" in page.inner_text("#model-badge")
        assert "not for diagnosis" in page.content()

        page.set_input_files("#film-upload input[type=file]", str(film))
        page.wait_for_selector("#film-notes :text('Loaded:')", timeout=60_000)
        assert "DICOM DX" in page.inner_text("#film-notes")
        page.wait_for_selector("#film-preview img", timeout=30_000)

        page.evaluate(COUNT_CHAT_MUTATIONS)
        page.fill("#question textarea", "Is there a pleural effusion?")
        page.click("#ask")
        bot = page.locator("#chat .bot").last
        bot.wait_for(timeout=60_000)
        page.wait_for_function(
            "() => document.querySelector('#ask') && !document.querySelector('#ask').disabled "
            "&& document.querySelectorAll('#chat .bot').length > 0 "
            "&& document.querySelector('#chat .bot').innerText.trim().length > 20",
            timeout=120_000,
        )
        page.wait_for_selector("#chat .bot :text('confidence')", timeout=60_000)  # the details line, once done
        bot.locator("details.answer-details summary").click()  # the details fold into one line; open them
        answer = bot.inner_text().strip()
        mutations = page.evaluate("() => window.__chatMutations")
        page.screenshot(path=str(ARTIFACTS / "browser_chat.png"), full_page=True)

        page.click("#report")
        page.wait_for_selector("#report-box :text('Chest X-ray report')", timeout=120_000)
        page.wait_for_selector("#report-json:visible", timeout=60_000)
        report = page.inner_text("#report-box")
        with page.expect_download(timeout=60_000) as download_info:
            page.click("#report-json")
        exported = json.loads(Path(download_info.value.path()).read_text())
        page.screenshot(path=str(ARTIFACTS / "browser_report.png"), full_page=True)
        browser.close()

    assert answer.startswith("Yes") and "right pleural effusion" in answer, answer  # what the film shows
    assert mutations > 3, f"expected the answer to arrive in several updates, saw {mutations} DOM changes"
    assert re.search(r"confidence \d+%", answer) and "not the probability that the answer is right" in answer
    assert "Findings" in report and "Impression" in report and "Confidence" in report
    assert list(exported["fields"]) == [field.key for field in REPORT_FIELDS] and exported["raw_text"]
