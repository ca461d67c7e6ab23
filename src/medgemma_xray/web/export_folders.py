"""Folders that page exports are written into, in the server's private cache, under the upload limits.

A page hands Gradio the path of each export; Gradio copies the file into its own cache (deleted after
CACHE_MAX_AGE_S) and serves that copy. The folder written here is then needed no longer, and unless removed it would
stay until the server stops. So every new export first deletes export folders older than CACHE_MAX_AGE_S, and the
folders held at once stay under UPLOAD_CACHE_MAX_MB: the oldest go first, and an export that would not fit even then
is refused with a message.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

EXPORT_PREFIXES = ("teaching-report-", "teaching-session-")
FULL_MESSAGE = "The server's export space is full. Try again in a minute."


class ExportSpaceFull(ValueError):
    """Exports held at once would pass the byte limit even after the oldest were removed."""


_LOCK = threading.Lock()


def new_export_folder(root: Path, prefix: str, *, max_age_s: float, quota_bytes: int, incoming_bytes: int) -> Path:
    """A fresh private folder (0700) under root for an export of about incoming_bytes, after expired and, if need
    be, the oldest export folders are removed. Raises ExportSpaceFull when it cannot fit."""
    if prefix not in EXPORT_PREFIXES:
        raise ValueError(f"export folder prefix must be one of {EXPORT_PREFIXES}, got {prefix!r}")
    with _LOCK:
        folders = sorted(_export_folders(root), key=lambda item: item[1])  # oldest first
        cutoff = time.time() - max_age_s
        kept = []
        for folder, modified, size in folders:
            if modified < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
            else:
                kept.append((folder, size))
        held = sum(size for _, size in kept)
        while kept and held + incoming_bytes > quota_bytes:
            folder, size = kept.pop(0)
            shutil.rmtree(folder, ignore_errors=True)
            held -= size
        if held + incoming_bytes > quota_bytes:
            raise ExportSpaceFull(FULL_MESSAGE)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def _export_folders(root: Path) -> list[tuple[Path, float, int]]:
    found = []
    for folder in Path(root).iterdir():
        if not folder.name.startswith(EXPORT_PREFIXES) or folder.is_symlink() or not folder.is_dir():
            continue
        try:
            files = [path.lstat() for path in folder.iterdir()]
            found.append((folder, folder.lstat().st_mtime, sum(stat.st_size for stat in files)))
        except OSError:
            continue
    return found
