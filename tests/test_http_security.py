"""Attacks on a real server process over HTTP: named paths, private short-lived uploads, upload size, patient data
in logs, the HTTP surface, login, and the cache after kill -9. Raw requests and gradio_client alike."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file

from devtools.hostile_files import FAKE_IDENTIFIERS, FAKE_IDENTIFYING_FILE_NAME, png_bomb
from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize
from tests.conftest import REPO_ROOT, ServerProcess, free_port, start_server

pytestmark = pytest.mark.slow

PHI_MARKERS = (
    "ZZTESTPATIENT",
    "SECRETNAME",
    "PID-7731",
    "ACC-SECRET",
    "SECRET GENERAL",
    "SECRETREFERRER",
    "19010203",
    "77310000000000000001",
    "77310000000000000002",
    "SECRETDOB",
)
FORGED_ANSWER = "through the upload route"


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_model_dir) -> ServerProcess:
    env = {"MAX_TURNS": "2", "MAX_PROMPT_TOKENS": "200", "MAX_NEW_TOKENS": "4", "MAX_FILE_SIZE_MB": "2"}
    server = start_server(tmp_path_factory.mktemp("hardened"), env=env)
    yield server
    server.stop()


def cache_of(server: ServerProcess) -> Path:
    return server.log_dir / "upload-cache"


def identified_dicom(**overrides) -> bytes:
    """A film whose tags carry every kind of identifier the logs must never show."""
    import io

    import pydicom

    data = dicom_bytes(quantize(chest_phantom(seed=21), 12), bits_stored=12, window=(2048, 4096), **overrides)
    dataset = pydicom.dcmread(io.BytesIO(data))
    for keyword, value in FAKE_IDENTIFIERS.items():
        setattr(dataset, keyword, value)
    buffer = io.BytesIO()
    dataset.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def call(server: ServerProcess, api: str, data: list) -> tuple[int, str]:
    """One call through Gradio's REST route: POST, then read the event stream. Returns (status, final text)."""
    posted = httpx.post(f"{server.url}/gradio_api/call/{api}", json={"data": data}, timeout=30)
    if posted.status_code != 200:
        return posted.status_code, posted.text
    stream = httpx.get(f"{server.url}/gradio_api/call/{api}/{posted.json()['event_id']}", timeout=120)
    return stream.status_code, stream.text.strip().split("\n\n")[-1]


def upload(server: ServerProcess, name: str, content: bytes) -> str:
    reply = httpx.post(f"{server.url}/gradio_api/upload", files=[("files", (name, content))], timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()[0]


def file_data(path: str) -> dict:
    return {"path": path, "meta": {"_type": "gradio.FileData"}}


def named_paths(server: ServerProcess, tmp_path: Path) -> list[str]:
    cache_of(server).mkdir(exist_ok=True)
    link = cache_of(server) / "planted-link.png"  # a link inside the cache pointing out of it
    link.unlink(missing_ok=True)
    link.symlink_to("/etc/passwd")
    return [
        "/etc/shadow",
        "/etc/passwd",
        "/nonexistent/film.png",
        str(server.log_dir / "control.token"),
        str(server.log_dir / "gradio_app.log"),
        f"{cache_of(server)}/../gradio_app.log",
        str(cache_of(server)),
        str(link),
        f"http://127.0.0.1:{server.url.rsplit(':', 1)[1]}/healthz",
        "file:///etc/passwd",
    ]


def test_a_client_named_path_gets_one_fixed_answer_whatever_the_path(server, tmp_path):
    upload_index = next(
        index
        for index, dep in enumerate(httpx.get(f"{server.url}/config").json()["dependencies"])
        if dep.get("api_name") == "upload_film"
    )
    answers, joins, client_errors = set(), set(), set()
    client = Client(server.url, verbose=False)
    paths = named_paths(server, tmp_path)
    for path in paths:
        answers.add(call(server, "upload_film", [file_data(path), None]))
        join = httpx.post(
            f"{server.url}/gradio_api/queue/join",
            json={"data": [file_data(path), None], "fn_index": upload_index, "session_hash": "attacker01"},
        )
        joins.add((join.status_code, join.text))
        try:  # a dict without "meta" is sent as is by gradio_client (with "meta", it uploads its own local file)
            client.predict({"path": path, "orig_name": "film.png"}, api_name="/upload_film")
            client_errors.add("accepted")
        except Exception as exc:
            client_errors.add(f"{type(exc).__name__}: {exc}".replace(server.url, "URL"))
    Path(paths[7]).unlink()
    assert len(answers) == 1 and len(joins) == 1 and len(client_errors) == 1, (answers, joins, client_errors)
    status, body = answers.pop()
    assert status == 403 and FORGED_ANSWER in body
    assert joins.pop()[0] == 403
    token = (server.log_dir / "control.token").read_text().strip()
    log = server.log_text
    assert "/etc/shadow" not in log and "nonexistent" not in log and token not in log
    assert "Traceback" not in log


def test_uploads_are_private_and_deleted_as_soon_as_read(server):
    name = f"{FAKE_IDENTIFYING_FILE_NAME}.dcm"
    stored = Path(upload(server, name, identified_dicom()))
    cache = cache_of(server)
    assert stored.is_relative_to(cache) and stored.exists()  # this server's cache, not the host-wide /tmp/gradio
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    for folder in (cache, stored.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700

    status, final = call(server, "upload_film", [file_data(str(stored)), None])
    assert status == 200 and final.startswith("event: complete"), final
    assert not stored.exists() and not any(stored.parent.iterdir())  # gone once the film is in memory
    preview = Path(json.loads(final.split("data: ", 1)[1])[0]["path"])
    assert preview.is_relative_to(cache) and stat.S_IMODE(preview.stat().st_mode) == 0o600
    leftovers = [p for p in cache.rglob("*") if "ZZTEST" in p.name or p.suffix == ".dcm"]
    assert leftovers == []
    for entry in cache.rglob("*"):
        assert stat.S_IMODE(entry.stat().st_mode) in ((0o700,) if entry.is_dir() else (0o600,)), entry


def test_uploads_over_the_size_limit_are_refused(server):
    before = sorted(cache_of(server).rglob("*"))
    reply = httpx.post(f"{server.url}/gradio_api/upload", files=[("files", ("big.dcm", b"\0" * (3 << 20)))], timeout=60)
    assert reply.status_code == 413
    assert sorted(cache_of(server).rglob("*")) == before


def test_no_file_name_or_dicom_identifier_reaches_any_log_or_metric(server, tmp_path):
    films = {
        "good.dcm": identified_dicom(),
        "ct.dcm": identified_dicom(modality="CT"),
        "window0.dcm": identified_dicom(),
        "cut.dcm": identified_dicom()[:4000],
        "bomb.png": png_bomb(13000, 13000),
        "notes.txt": b"Patient ZZTESTPATIENT SECRETNAME, not an image",
    }
    films["window0.dcm"] = films["window0.dcm"].replace(b"4096", b"0   ")  # Window Width 0, as some exports have
    client = Client(server.url, verbose=False)
    with pytest.raises(Exception, match="Upload a chest X-ray first"):
        client.predict("Any pneumothorax?", api_name="/ask")  # a refusal of ours, logged as one line too
    loaded, refused = 0, []
    for label, content in films.items():
        path = tmp_path / f"{FAKE_IDENTIFYING_FILE_NAME}_SECRETDOB_{label}"
        path.write_bytes(content)
        try:
            notes = client.predict(handle_file(str(path)), api_name="/upload_film")[1]
            assert "Loaded:" in notes
            loaded += 1
        except Exception as exc:
            refused.append(str(exc))
    assert loaded == 2 and len(refused) == 4, refused
    assert all("ZZTEST" not in message and "Internal error" not in message for message in refused)
    client.predict(
        handle_file(str(tmp_path / f"{FAKE_IDENTIFYING_FILE_NAME}_SECRETDOB_good.dcm")), api_name="/upload_film"
    )
    client.predict("What are the main findings?", api_name="/ask")
    client.predict(api_name="/report")
    metrics = httpx.get(f"{server.url}/metrics").text

    found = [(marker, "metrics") for marker in PHI_MARKERS if marker in metrics]
    for file in sorted(server.log_dir.rglob("*")):
        text = file.name if file.is_dir() or file.is_socket() else file.name + file.read_bytes().decode("latin-1")
        found += [(marker, str(file.relative_to(server.log_dir))) for marker in PHI_MARKERS if marker in text]
    assert found == [], found
    log = server.log_text
    assert "Traceback" not in log
    assert log.count("user error: ") >= 5  # each refusal: one line with its class
    assert "user error: ImageTooLargeError" in log and "user error: CorruptImageError" in log


def test_conversation_limits_are_settings(server, tmp_path):
    film = tmp_path / "film.dcm"
    film.write_bytes(dicom_bytes(quantize(chest_phantom(seed=3), 12), bits_stored=12))
    client = Client(server.url, verbose=False)
    client.predict(handle_file(str(film)), api_name="/upload_film")
    with pytest.raises(Exception, match="at most 200 tokens"):
        client.predict("Describe the film. " * 20, api_name="/ask")
    client.predict("Findings?", api_name="/ask")
    client.predict("Heart size?", api_name="/ask")
    with pytest.raises(Exception, match="limit of 2 questions. Press New case"):
        client.predict("And the bones?", api_name="/ask")


def test_the_http_surface_shows_no_docs_traces_or_server_paths(server):
    for route in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert httpx.get(server.url + route).status_code == 404, route
    config = httpx.get(f"{server.url}/config").json()
    assert config["analytics_enabled"] is False and config["show_error"] is False
    ct = dicom_bytes(quantize(chest_phantom(), 12), bits_stored=12, modality="CT")
    requests = [
        ("POST", "/gradio_api/call/upload_film", {"content": b"{not json"}),
        ("POST", "/gradio_api/call/no_such_api", {"json": {"data": []}}),
        ("POST", "/gradio_api/queue/join", {"json": {"data": [], "fn_index": 999, "session_hash": "x"}}),
        ("GET", "/gradio_api/file=/etc/passwd", {}),
        ("GET", "/gradio_api/call/upload_film/no-such-event", {}),
        ("GET", "/gradio_api/queue/data?session_hash=nobody", {}),
    ]
    texts = []
    for method, route, body in requests:
        try:
            texts.append(httpx.request(method, server.url + route, timeout=10, **body).text)
        except httpx.HTTPError as exc:  # an event stream that the server closes: nothing was said
            texts.append(type(exc).__name__)
    texts.append(call(server, "upload_film", [file_data(upload(server, "ct.dcm", ct)), None])[1])
    assert "The modality is CT" in texts[-1]
    # Gradio's protocol answers an upload with its place in the cache (the client names it in the next call):
    # the one server path a client sees, inside this server's private cache, under a sanitised name.
    (stored,) = httpx.post(f"{server.url}/gradio_api/upload", files=[("files", ("../../../x.png", b"x"))]).json()
    assert Path(stored).parent.parent == cache_of(server) and Path(stored).name == "x.png"
    for text in texts:
        for leak in ("Traceback", 'File "', str(REPO_ROOT), "site-packages", "gradio_app.log", str(server.log_dir)):
            assert leak not in text, (leak, text[:300])


def test_login_is_off_by_default_and_on_with_a_private_credentials_file(tmp_path, demo_model_dir, server):
    assert httpx.get(f"{server.url}/config").status_code == 200  # the default: no login
    credentials = tmp_path / "credentials"
    added = subprocess.run(
        [sys.executable, "-m", "medgemma_xray.web.http_auth", "add", "--file", str(credentials), "--user", "teacher"],
        cwd=REPO_ROOT,
        input="ward round 2026\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    guarded = start_server(tmp_path / "logs", env={"AUTH_FILE": str(credentials)})
    try:
        assert httpx.get(f"{guarded.url}/config").status_code == 401
        assert httpx.post(f"{guarded.url}/gradio_api/upload", files=[("files", ("x.png", b"x"))]).status_code == 401
        assert httpx.get(f"{guarded.url}/healthz").status_code == 200  # probes stay open for the service manager
        with pytest.raises(Exception):  # noqa: B017 (gradio_client raises its own error types)
            Client(guarded.url, verbose=False, auth=("teacher", "wrong password"))
        film = tmp_path / "film.dcm"
        film.write_bytes(dicom_bytes(quantize(chest_phantom(seed=4), 12), bits_stored=12))
        client = Client(guarded.url, verbose=False, auth=("teacher", "ward round 2026"))
        assert "Loaded:" in client.predict(handle_file(str(film)), api_name="/upload_film")[1]
    finally:
        guarded.stop()
    assert "ward round" not in guarded.log_text

    os.chmod(credentials, 0o644)
    port = free_port()
    refused = subprocess.run(
        [sys.executable, "app.py", "--port", str(port)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AUTH_FILE": str(credentials), "LOG_DIR": str(tmp_path / "logs2")},
    )
    assert refused.returncode == 2 and "chmod 600" in refused.stderr


def test_the_cache_is_emptied_at_start_after_kill_9_and_at_stop(tmp_path, demo_model_dir):
    logs = tmp_path / "logs"
    first = start_server(logs)
    try:
        left = Path(upload(first, f"{FAKE_IDENTIFYING_FILE_NAME}.dcm", identified_dicom()))  # uploaded, never read
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=30)
    finally:
        first.stop()
    assert left.exists()  # what a crash leaves behind
    second = start_server(logs)
    try:
        assert not left.exists() and not left.parent.exists()
        assert "removed 1 files left in the upload cache" in second.log_text
        unread = Path(upload(second, "film.dcm", identified_dicom()))
    finally:
        second.stop()
    assert second.process.returncode == 0 and not unread.exists()
    assert sorted(p.name for p in (logs / "upload-cache").iterdir()) == [".medgemma-upload-cache"]
