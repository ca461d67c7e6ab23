"""This server's private upload cache, and reading each upload exactly once.

Gradio writes uploads and previews under GRADIO_TEMP_DIR, by default the host-wide /tmp/gradio: folders 0755,
previews 0644, original file names (which may hold patient names) listed for every local user, and files kept for
hours. Here the cache is one folder per server (mode 0700, files 0600 through the server's umask), emptied at start
(after a crash) and at stop, and each upload is deleted as soon as its bytes are in memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER = ".medgemma-upload-cache"  # only a folder carrying this is ever emptied


class NotAnUploadError(ValueError):
    """A client named a file that did not come in through the upload route."""


class UploadGoneError(ValueError):
    """The upload is no longer on the server (read and deleted long ago, or cleaned)."""


class PrivateCache:
    """The folder Gradio caches uploads and previews in, held (flock) by this server for its whole life."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd = lock_fd

    @classmethod
    def open(cls, path: Path) -> PrivateCache:
        """Create or empty the cache and point GRADIO_TEMP_DIR at it.

        Must run before gradio is imported: gradio reads GRADIO_TEMP_DIR once, at import (route_utils).
        """
        if "gradio" in sys.modules:
            raise RuntimeError("the private upload cache must be set up before gradio is imported")
        path = Path(path).resolve()
        if path.exists() and not path.is_dir():
            raise ValueError(f"UPLOAD_CACHE_DIR {path} is not a folder")
        if path.is_dir() and any(path.iterdir()) and not (path / MARKER).exists():
            raise ValueError(
                f"UPLOAD_CACHE_DIR {path} holds files but is not this app's upload cache; it is never emptied. "
                "Point UPLOAD_CACHE_DIR at a new or empty folder."
            )
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
        lock_fd = os.open(path / MARKER, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise ValueError(
                f"another running server uses the upload cache {path}; give each server its own LOG_DIR "
                "or UPLOAD_CACHE_DIR"
            ) from None
        cache = cls(path, lock_fd)
        removed = cache.empty()
        if removed:
            logger.warning("removed %d files left in the upload cache by an earlier run", removed)
        os.environ["GRADIO_TEMP_DIR"] = str(path)
        return cache

    def empty(self) -> int:
        """Delete everything in the cache but its marker. Returns the number of files removed."""
        removed = 0
        for entry in self.path.iterdir():
            if entry.name == MARKER:
                continue
            if entry.is_dir() and not entry.is_symlink():
                removed += sum(1 for child in entry.rglob("*") if not child.is_dir())
                shutil.rmtree(entry, ignore_errors=True)
            else:
                removed += 1
                entry.unlink(missing_ok=True)
        return removed

    def close(self) -> None:
        """Empty the cache and release it. Idempotent."""
        if self._lock_fd < 0:
            return
        self.empty()
        os.close(self._lock_fd)
        self._lock_fd = -1


class UploadInbox:
    """Reads each uploaded file once, then deletes it from disk before anything decodes it.

    Gradio stores an upload under a hash of its content (<cache>/<sha256>/<name>), so several people uploading the
    same film at once (a teaching round) share one file: the first reader deletes it under the others. A path read
    in the last `grace_s` seconds is therefore answered from memory; the same path means the same content.
    """

    def __init__(self, folder: Path, grace_s: float = 30.0, budget_bytes: int = 128 << 20) -> None:
        self.folder = Path(folder).resolve()
        self.grace_s = grace_s
        self.budget_bytes = budget_bytes
        self._recent: OrderedDict[Path, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, file_path: str | os.PathLike) -> bytes:
        path = Path(file_path).resolve()
        if not path.is_relative_to(self.folder) or path == self.folder:
            raise NotAnUploadError(FORGED_PATH_MESSAGE)
        with self._lock:
            self._forget_old()
            try:
                data = _read_and_delete(path)
            except FileNotFoundError:
                recent = self._recent.get(path)
                if recent is None:
                    raise UploadGoneError(
                        "The uploaded file is no longer on the server. Upload the film again."
                    ) from None
                return recent[1]
            self._recent[path] = (time.monotonic(), data)
            self._keep_within_budget()
            return data

    def _forget_old(self) -> None:
        cutoff = time.monotonic() - self.grace_s
        while self._recent and next(iter(self._recent.values()))[0] < cutoff:
            self._recent.popitem(last=False)

    def _keep_within_budget(self) -> None:
        while len(self._recent) > 1 and sum(len(data) for _, data in self._recent.values()) > self.budget_bytes:
            self._recent.popitem(last=False)


FORGED_PATH_MESSAGE = (
    "Files must be sent through the upload route (/gradio_api/upload) first; a path on the server cannot be named."
)


def _read_and_delete(path: Path) -> bytes:
    with open(path, "rb") as upload:
        data = upload.read()
    path.unlink(missing_ok=True)
    # Gradio's per-upload folder (named by the content hash, never by the file) stays until the cache's age-based
    # cleanup: removing it here raced Gradio's own mkdir(exist_ok=True) for a concurrent upload of the same film,
    # which then failed with HTTP 500 (seen under the 16-client load test).
    return data


class UploadLedger:
    """The files that came in through the upload route, with their sizes and times: a byte quota and an age limit
    for them, and a way to tell an upload from the server's own files (previews, report exports) in the same cache.

    Gradio keeps an upload until its cache cleanup (CACHE_MAX_AGE_S, 10 minutes by default), and one request may
    carry any number of files: 40 x 4 MiB added 160 MiB in 2 s. The upload route (medgemma_xray.web.upload_route)
    reserves each chunk's bytes here before writing it, so the quota holds however many requests write at once,
    and records the files it stored (their reservation becomes their size). Bytes of uploads already read (the
    inbox deletes each one) come back to the quota when a reservation would not fit.
    """

    def __init__(self, quota_bytes: int, max_age_s: float, clock=time.monotonic) -> None:
        self.quota_bytes = quota_bytes
        self.max_age_s = max_age_s
        self.clock = clock
        self._files: dict[str, tuple[float, int]] = {}  # resolved path -> (time recorded, bytes)
        self._stored = 0  # the sum of the sizes in _files
        self._reserved = 0  # bytes being written by requests not finished yet
        self._lock = threading.Lock()

    def reserve(self, size: int) -> bool:
        """Set `size` bytes aside for a write about to happen; False (nothing set aside) if the quota has no room."""
        with self._lock:
            if self._stored + self._reserved + size > self.quota_bytes:
                self._forget_gone()
                if self._stored + self._reserved + size > self.quota_bytes:
                    return False
            self._reserved += size
            return True

    def release(self, size: int) -> None:
        """Give back a reservation whose bytes were not kept (a refused request's, deleted)."""
        with self._lock:
            self._reserved = max(0, self._reserved - size)

    def record(self, paths: list[str], reserved: int = 0) -> None:
        """The files a request stored; `reserved`, the bytes it set aside for them, is given back."""
        now = self.clock()
        with self._lock:
            self._reserved = max(0, self._reserved - reserved)
            for named in paths:
                try:
                    path = Path(named).resolve()
                    size = path.stat().st_size
                except (OSError, ValueError, TypeError):
                    continue
                self._stored -= self._files.get(str(path), (0.0, 0))[1]
                self._files[str(path)] = (now, size)
                self._stored += size

    def is_upload(self, path: str | os.PathLike) -> bool:
        try:
            resolved = str(Path(path).resolve())
        except (OSError, ValueError, RuntimeError):
            return False
        with self._lock:
            return resolved in self._files

    def held_bytes(self) -> int:
        """Bytes of uploads still on disk (the inbox deletes each upload once read), plus those being written."""
        with self._lock:
            self._forget_gone()
            return self._stored + self._reserved

    def remove_expired(self) -> int:
        """Delete uploads older than max_age_s that nobody read; returns how many."""
        cutoff = self.clock() - self.max_age_s
        with self._lock:
            old = [path for path, (when, _) in self._files.items() if when < cutoff]
            for path in old:
                self._stored -= self._files.pop(path)[1]
        for path in old:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return len(old)

    def has_room_for(self, incoming_bytes: int) -> bool:
        """Whether a request of this many bytes would fit now (a quick refusal before reading its body; the
        reservation per chunk is what holds the quota)."""
        self.remove_expired()
        return self.held_bytes() + incoming_bytes <= self.quota_bytes

    def _forget_gone(self) -> None:
        gone = [path for path in self._files if not os.path.exists(path)]
        for path in gone:
            self._stored -= self._files.pop(path)[1]
