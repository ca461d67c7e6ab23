"""The README's two screenshots, taken from a real server on the demo model in headless Chromium.

    .venv/bin/python -m devtools.docs_screenshots              # writes docs/images/main-page.png and teaching.png

It starts app.py on a free loopback port with a private LOG_DIR, opens a labelled phantom on the main page and asks
about it, then opens a library case on /teaching and reveals it, waits for each answer to finish, and stops the
server. Nothing is mocked: what the pictures show is what the demo model answered. Look at both files before
committing them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT = REPO_ROOT / "docs" / "images"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
MAIN_QUESTION = "What are the main findings on this chest X-ray?"
TEACHING_CASE = "Phantom case 04"  # the starter library's case with a central line and a pacemaker
TEACHING_QUESTION = "Where does the central line tip lie?"
WATCH_CHAT = """() => { window.__chatChanged = Date.now();
  new MutationObserver(() => { window.__chatChanged = Date.now(); })
    .observe(document.querySelector('#teach-chat'), {subtree: true, childList: true, characterData: true}); }"""
CHAT_SETTLED = "() => Date.now() - window.__chatChanged > 2000"
ANSWER_DONE = (
    "() => { const ask = document.querySelector('#ask'); const bots = document.querySelectorAll('#chat .bot');"
    " return ask && !ask.disabled && bots.length > 0 && bots[bots.length - 1].innerText.includes('confidence'); }"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} during start-up")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready within {timeout_s:.0f} s")


def _main_page(browser, url: str, film: Path, output: Path) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url, wait_until="load")
    page.wait_for_selector("#model-badge :text('Mode:')", timeout=120_000)
    page.set_input_files("#film-upload input[type=file]", str(film))
    page.wait_for_selector("#film-notes :text('Loaded:')", timeout=120_000)
    page.wait_for_selector("#film-preview img", timeout=60_000)
    page.fill("#question textarea", MAIN_QUESTION)
    page.click("#ask")
    page.wait_for_function(ANSWER_DONE, timeout=300_000)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(output))
    page.close()


def _requests_answered(page, url: str) -> float:
    """medgemma_requests_total from the server's own /metrics: it counts each answer once it has finished."""
    body = page.request.get(f"{url}/metrics").text()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("medgemma_requests_total")
    )


def _teaching_page(browser, url: str, output: Path) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1120})
    page.goto(f"{url}/teaching", wait_until="load")
    page.wait_for_selector("#teach-library :text('cases in the library')", timeout=120_000)
    page.click("#teach-case input")
    page.click(f"#teach-case li[role=option][aria-label='{TEACHING_CASE}']")
    page.click("#teach-open")
    page.wait_for_selector("#teach-measure :text('Ruler')", timeout=120_000)
    answered = _requests_answered(page, url)
    page.uncheck("#teach-quiz input")  # quiz mode locks the questions until the reveal: a discussion round instead
    page.wait_for_function("() => !document.querySelector('#teach-ask').disabled", timeout=60_000)
    page.fill("#teach-question textarea", TEACHING_QUESTION)
    page.click("#teach-ask")
    page.wait_for_function(
        "([n, url]) => fetch(url + '/metrics').then(r => r.text()).then(t => t.split('\\n')"
        ".filter(l => l.startsWith('medgemma_requests_total')).reduce((s, l) => s + Number(l.split(' ').pop()), 0) > n)",
        arg=[answered, url],
        timeout=300_000,
        polling=500,
    )
    page.evaluate(WATCH_CHAT)  # the last update reaches the page just after the server counts the answer
    page.wait_for_function(CHAT_SETTLED, timeout=60_000)
    page.evaluate(
        "() => window.scrollTo(0, document.querySelector('#teach-case-info').getBoundingClientRect().top + window.scrollY - 16)"
    )
    page.screenshot(path=str(output))
    page.close()


def take(output_dir: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from medgemma_xray.phantoms.labelled import write_labelled_set

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="docs-screenshots-") as scratch:
        work = Path(scratch)
        film = next(path for path in write_labelled_set(work / "films", 1) if path.suffix == ".png")
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        environment = {**os.environ, "LOG_DIR": str(work / "logs")}
        with open(work / "console.log", "wb") as console:
            process = subprocess.Popen(
                [sys.executable, "app.py", "--port", str(port), "--log_file", str(work / "logs" / "app.log")],
                cwd=REPO_ROOT,
                env=environment,
                stdout=console,
                stderr=subprocess.STDOUT,
            )
            try:
                _wait_ready(url, process)
                with sync_playwright() as playwright:
                    browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
                    try:
                        _main_page(browser, url, film, output_dir / "main-page.png")
                        _teaching_page(browser, url, output_dir / "teaching.png")
                    finally:
                        browser.close()
            finally:
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    return [output_dir / "main-page.png", output_dir / "teaching.png"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"folder for the PNGs (default {OUTPUT})")
    args = parser.parse_args(argv)
    for path in take(args.output):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
