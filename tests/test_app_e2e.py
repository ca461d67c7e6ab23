"""End to end against a real server process on the demo model, over HTTP with gradio_client."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from medgemma_xray.assistant.report_schema import REPORT_FIELDS
from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize

pytestmark = pytest.mark.slow


def answer_text(chat_messages: list[dict]) -> str:
    content = chat_messages[-1]["content"]
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def downloaded(update) -> str:
    """A file output as gradio_client hands it over: the local copy it downloaded (inside a visibility update)."""
    return update["value"] if isinstance(update, dict) else update


@pytest.fixture()
def dicom_film(tmp_path):
    path = tmp_path / "chest_pa"  # no extension: recognised by content
    stored = quantize(chest_phantom(seed=11), 12)
    path.write_bytes(
        dicom_bytes(
            stored,
            bits_stored=12,
            window=(2048, 4096),
            transfer_syntax="jpeg-2000-lossless",
            patient_name="Sentinel^Patient",
            patient_id="E2E-SENTINEL-ID",
        )
    )
    return path


def test_upload_dicom_ask_follow_up_and_report(demo_server, dicom_film):
    client = Client(demo_server.url, verbose=False)
    preview, notes, chat, report, *_ = client.predict(handle_file(str(dicom_film)), api_name="/upload_film")
    assert "DICOM DX, JPEG 2000 Image Compression (Lossless Only), 12-bit MONOCHROME2" in notes
    assert chat == [] and report == ""

    job = client.submit("What are the main findings?", api_name="/ask")
    streamed = [answer_text(update[0]) for update in job]
    first_answer = answer_text(job.result()[0])
    partials = [text for text in streamed if text]
    assert len(partials) >= 3, "the answer should arrive in several streamed updates"
    assert all(first_answer.startswith(text) for text in partials), "each update extends the last"
    assert len(first_answer) > 20

    chat, question_box = client.predict("And the heart size?", api_name="/ask")[:2]
    assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]
    assert answer_text(chat[:2]) == first_answer  # the first exchange is kept in the conversation
    assert question_box == ""

    # the folded details line under the answer leads with what a reader needs: the confidence, then time and tokens
    assert re.search(r"<summary>confidence \d+% · [\d.]+ s · \d+ tokens</summary>", first_answer), first_answer

    report_job = client.submit(api_name="/report")
    report_updates = list(report_job)
    final_report, json_file, markdown_file = report_job.result()
    assert len(report_updates) > 2
    assert final_report.startswith("# Chest X-ray report") and "## Findings" in final_report
    assert "## Impression" in final_report and "## Confidence" in final_report
    exported = json.loads(Path(downloaded(json_file)).read_text())
    assert list(exported["fields"]) == [field.key for field in REPORT_FIELDS]
    assert set(exported["unfilled"]) <= set(exported["fields"]) and exported["raw_text"]
    assert 0 < exported["overall_confidence"]["mean_probability"] <= 1
    assert Path(downloaded(markdown_file)).read_text().startswith("# Chest X-ray report")

    cleared = client.predict(api_name="/new_case")
    assert cleared[3] == [] and cleared[5] == ""
    assert [(button.get("value"), button.get("visible")) for button in cleared[6:8]] == [(None, False)] * 2
    with pytest.raises(Exception, match="Upload a chest X-ray first"):
        client.predict("Anything?", api_name="/ask")

    log = demo_server.log_text
    assert "decoded DICOM" in log
    assert "Sentinel" not in log and "E2E-SENTINEL-ID" not in log


def test_bad_input_is_explained_and_server_survives(demo_server, tmp_path):
    client = Client(demo_server.url, verbose=False)
    ct = tmp_path / "ct.dcm"
    ct.write_bytes(dicom_bytes(quantize(chest_phantom(), 12), bits_stored=12, modality="CT"))
    with pytest.raises(Exception, match="modality is CT"):
        client.predict(handle_file(str(ct)), api_name="/upload_film")
    junk = tmp_path / "notes.txt"
    junk.write_text("not an image")
    with pytest.raises(Exception, match="not a PNG, JPEG or DICOM"):
        client.predict(handle_file(str(junk)), api_name="/upload_film")
    truncated = tmp_path / "cut.dcm"
    truncated.write_bytes(dicom_bytes(quantize(chest_phantom(), 12), bits_stored=12)[:3000])
    with pytest.raises(Exception, match="truncated"):
        client.predict(handle_file(str(truncated)), api_name="/upload_film")
    with urllib.request.urlopen(f"{demo_server.url}/readyz", timeout=5) as reply:
        assert reply.status == 200
    assert demo_server.process.poll() is None


def test_probes_and_metrics(demo_server):
    with urllib.request.urlopen(f"{demo_server.url}/healthz", timeout=5) as reply:
        assert reply.status == 200
    with urllib.request.urlopen(f"{demo_server.url}/metrics", timeout=5) as reply:
        body = reply.read().decode()
    for series in (
        "medgemma_request_latency_seconds_bucket",
        "medgemma_time_to_first_token_seconds",
        "medgemma_generated_tokens_total",
        "medgemma_errors_total",
        "medgemma_switches_total",
        "medgemma_breaker_trips_total",
        "medgemma_requests_waiting",
        "medgemma_requests_running",
        "medgemma_gpu_memory_used_bytes",
    ):
        assert series in body, series


def test_same_film_uploaded_concurrently_gets_whole_previews(demo_server, dicom_film):
    """Teaching rounds: everyone uploads the same case at once. Each preview must arrive whole."""
    import threading

    failures, paths = [], []

    def upload_three_times() -> None:
        client = Client(demo_server.url, verbose=False)
        for _ in range(3):
            try:
                paths.append(client.predict(handle_file(str(dicom_film)), api_name="/upload_film")[0])
            except Exception as exc:
                failures.append(repr(exc)[:200])

    threads = [threading.Thread(target=upload_three_times) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    assert len(paths) == 24 and len(set(paths)) == 24  # one cache file per upload: no shared file to race on
