"""Gradio's queue summarises every finished event (pandas, np.percentile) in a worker thread after the answer has
gone out. Those threads are daemons: when the process exits while one is inside numpy's C++ code, the thread is
cancelled mid-frame and the whole process aborts ("terminate called without an active exception", exit -6; seen in
CI and, in 1 of 8 runs beside a busy core, with gdb showing gradio/queueing.py compute_analytics_summary ->
np.percentile on the cancelled thread). The summary only feeds Gradio's /monitoring pages, which RouteGuard
keeps out of reach, so the server never computes it."""

from __future__ import annotations

import pytest

from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize


@pytest.fixture
def served_app(tmp_path, monkeypatch):
    """The real app, built in this process around a service that loads no model (uploads need none)."""
    from fastapi.testclient import TestClient

    from medgemma_xray.serving.service import InferenceService
    from medgemma_xray.serving.settings import Settings
    from medgemma_xray.web import app as ui
    from medgemma_xray.web.http_server import build_http_app
    from medgemma_xray.web.upload_cache import UploadInbox

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))  # Gradio reads its upload folder when it builds
    service = InferenceService(Settings(log_dir=tmp_path))
    demo = ui.build_ui(service, UploadInbox(cache))
    with TestClient(build_http_app(service, demo, cache)) as client:
        yield demo, client


def upload_a_film(client) -> str:
    film = png_bytes(quantize(chest_phantom(seed=3), 8))
    path = client.post("/gradio_api/upload", files={"files": ("film.png", film, "image/png")}).json()[0]
    posted = client.post(
        "/gradio_api/call/upload_film", json={"data": [{"path": path, "meta": {"_type": "gradio.FileData"}}, None]}
    )
    return client.get(f"/gradio_api/call/upload_film/{posted.json()['event_id']}").text


def test_finished_events_leave_no_summary_work_to_gradios_worker_threads(served_app):
    demo, client = served_app
    for _ in range(3):
        assert "event: complete" in upload_a_film(client)
    queue = demo._queue
    assert queue.events_recorded >= 3  # the events went through the queue ...
    assert queue.cached_event_analytics_summary == {"functions": {}}  # ... and were never summarised
