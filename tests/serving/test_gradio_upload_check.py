"""The cause of the path-read hole, shown on the real app built in a fresh process (Starlette's test client):
with our guard taken out, Gradio's own upload check refuses a client-named path only because build_http_app marks
the mounted Blocks as launched; unmarked (as gr.mount_gradio_app leaves them), the path is read and served."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

CHILD = r"""
import json, os, sys
from pathlib import Path
cache, logs, secret, launched = sys.argv[1:5]
os.environ["GRADIO_TEMP_DIR"] = cache
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
from medgemma_xray.web import app as ui
from fastapi.testclient import TestClient
from medgemma_xray.web.http_server import build_http_app
from medgemma_xray.serving.service import InferenceService
from medgemma_xray.serving.settings import Settings
from medgemma_xray.web.upload_cache import UploadInbox

service = InferenceService(Settings(log_dir=Path(logs)))  # not started: loading a model is not needed here
demo = ui.build_ui(service, UploadInbox(cache))
http = build_http_app(service, demo, Path(cache))
http.user_middleware = [m for m in http.user_middleware if m.cls.__name__ != "FileReferenceGuard"]
if launched != "as-built":
    demo.has_launched = False  # what gr.mount_gradio_app leaves
with TestClient(http) as client:
    posted = client.post("/gradio_api/call/upload_film",
                         json={"data": [{"path": secret, "meta": {"_type": "gradio.FileData"}}, None]})
    events = client.get(f"/gradio_api/call/upload_film/{posted.json()['event_id']}").text
print(json.dumps({"events": events.strip().split("\n\n")[-1]}))
"""


def named_path_outcome(tmp_path, launched: bool) -> str:
    """launched: the app as build_http_app makes it; else with the launched mark taken off again."""
    secret = tmp_path / "outside" / "private.png"  # a readable film outside the upload folder
    secret.parent.mkdir(exist_ok=True)
    secret.write_bytes(png_bytes(quantize(chest_phantom(seed=8), 8)))
    cache = tmp_path / ("cache-launched" if launched else "cache-unlaunched")
    cache.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(cache), str(tmp_path), str(secret), "as-built" if launched else "unmarked"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])["events"]


def test_gradio_refuses_a_named_path_once_the_blocks_count_as_launched(tmp_path):
    assert named_path_outcome(tmp_path, launched=True) == 'event: error\ndata: {"error": null}'


def test_without_the_launched_mark_the_named_file_is_served(tmp_path):
    outcome = named_path_outcome(tmp_path, launched=False)
    assert outcome.startswith("event: complete") and "Loaded:" in outcome  # the hole the issue reported
