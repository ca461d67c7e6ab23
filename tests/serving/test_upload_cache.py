"""The private upload cache and the read-once inbox, on real folders, files, flocks and threads."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from medgemma_xray.web.upload_cache import MARKER, NotAnUploadError, UploadGoneError, UploadInbox
from tests.conftest import REPO_ROOT


def open_cache_in_child(path) -> subprocess.CompletedProcess:
    """PrivateCache.open must run before gradio is imported, and it holds its folder for the process's life."""
    script = (
        "import sys, time\nfrom medgemma_xray.web.upload_cache import PrivateCache\n"
        f"cache = PrivateCache.open({str(path)!r})\nprint('opened', flush=True)\n"
        "sys.stdin.readline()\ncache.close()\nprint('closed', flush=True)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def open_cache_and_exit(path) -> subprocess.CompletedProcess:
    """PrivateCache.open once in a fresh process (it refuses once gradio is imported, which an earlier test in this
    pytest worker may have done), for the refusals it gives before holding anything."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            f"from medgemma_xray.web.upload_cache import PrivateCache\nPrivateCache.open({str(path)!r})",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cache_is_private_emptied_at_open_and_close_and_held_by_one_server(tmp_path):
    path = tmp_path / "logs" / "upload-cache"
    path.mkdir(parents=True)
    (path / MARKER).touch()
    left = path / "0f3c9a"
    left.mkdir()
    (left / "ZZTESTPATIENT.dcm").write_bytes(b"left by a crashed server")

    first = open_cache_in_child(path)
    assert first.stdout.readline().strip() == "opened", first.stderr.read()
    assert sorted(os.listdir(path)) == [MARKER]  # crash leftovers removed
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    (path / "abc").mkdir()
    (path / "abc" / "upload.png").write_bytes(b"x")

    second = open_cache_and_exit(path)
    assert second.returncode != 0 and "another running server uses the upload cache" in second.stderr
    assert (path / "abc" / "upload.png").exists()  # the second server did not empty the first one's cache

    first.stdin.write("\n")
    first.stdin.flush()
    assert first.stdout.readline().strip() == "closed"
    first.wait(timeout=30)
    assert sorted(os.listdir(path)) == [MARKER]


def test_a_foreign_folder_is_never_emptied(tmp_path):
    home = tmp_path / "someones-home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    result = open_cache_and_exit(home)  # in a child: this test failed once when run after a gradio import
    assert result.returncode != 0 and "ValueError" in result.stderr
    assert "not this app's upload cache; it is never emptied" in result.stderr
    assert (home / "thesis.tex").read_text() == "years of work"


def test_open_refuses_after_gradio_is_imported(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import gradio\nfrom medgemma_xray.web.upload_cache import PrivateCache\nPrivateCache.open({str(tmp_path / 'c')!r})",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "before gradio is imported" in result.stderr


def write_upload(folder, content: bytes, name: str = "ZZTESTPATIENT_film.dcm"):
    upload = folder / "3f2a" / name  # Gradio's layout: <cache>/<content hash>/<original name>
    upload.parent.mkdir(parents=True, exist_ok=True)
    upload.write_bytes(content)
    return upload


def test_an_upload_is_read_once_and_deleted_before_decoding(tmp_path):
    inbox = UploadInbox(tmp_path)
    upload = write_upload(tmp_path, b"DICM bytes")
    assert inbox.take(str(upload)) == b"DICM bytes"
    assert not upload.exists()
    # The hash-named folder stays (empty) for the age-based cleanup: Gradio may be creating it for another upload
    # of the same film right now, and its mkdir(exist_ok=True) fails if the folder vanishes in between.
    assert upload.parent.is_dir() and not any(upload.parent.iterdir())


def test_concurrent_uploads_of_one_film_all_get_it(tmp_path):
    """Gradio names an upload by its content hash, so eight people uploading the same film share one file."""
    inbox = UploadInbox(tmp_path)
    upload = write_upload(tmp_path, b"the same film" * 1000)
    results, start = [], threading.Barrier(8)

    def take() -> None:
        start.wait()
        results.append(inbox.take(str(upload)))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == [b"the same film" * 1000] * 8
    assert not upload.exists()


def test_paths_outside_the_folder_and_stale_uploads_are_refused(tmp_path):
    inbox = UploadInbox(tmp_path / "cache", grace_s=0.2)
    (tmp_path / "cache").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    escape = tmp_path / "cache" / "link"
    escape.symlink_to(secret)
    for named in (secret, escape, tmp_path / "cache" / ".." / "secret.txt", tmp_path / "cache"):
        with pytest.raises(NotAnUploadError, match="through the upload route"):
            inbox.take(str(named))
    assert secret.read_text() == "token"
    upload = write_upload(tmp_path / "cache", b"film")
    inbox.take(str(upload))
    time.sleep(0.3)
    with pytest.raises(UploadGoneError, match="Upload the film again"):
        inbox.take(str(upload))
