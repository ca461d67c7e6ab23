"""The results file: one JSON record per line, appended and fsynced as each finishes, the only record of what is done.

A kill -9 can leave at most a torn last line (a partial write): opening the journal detects it and drops it, so a
resumed run redoes that one record, never duplicates or loses another. One run at a time writes to a folder: a
second one is refused by an flock on <folder>/.lock.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

RESULTS_NAME = "results.jsonl"
LOCK_NAME = ".lock"


class FolderBusyError(RuntimeError):
    """Another batch run holds this output folder."""


def fsync_directory(folder: Path) -> None:
    """Make a rename or a new file in folder durable (POSIX needs the directory itself synced)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, data: bytes) -> None:
    """Write data to path so that a crash leaves either the old file or the whole new one."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def record_key(record: dict) -> tuple[str, str]:
    return record["film_id"], record["task"]


def _parse_line(line: bytes) -> dict | None:
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("film_id"), str) or "task" not in record:
        return None
    return record


class Journal:
    """The results JSONL of one output folder. Open it with `Journal.open`, which recovers and locks it."""

    def __init__(self, path: Path, records: list[dict], lock_handle) -> None:
        self.path = path
        self._records = records
        self._keys = {record_key(record) for record in records}
        self._lock_handle = lock_handle
        self._handle = open(path, "ab")  # noqa: SIM115 (closed by close())

    @classmethod
    def open(cls, folder: Path, drop_failed: bool = False) -> Journal:
        """Lock the folder, read the journal, drop a torn or unreadable line (and, if asked, the failed records)."""
        folder.mkdir(parents=True, exist_ok=True)
        lock_handle = open(folder / LOCK_NAME, "a")  # noqa: SIM115 (held until close())
        try:
            fcntl.flock(lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_handle.close()
            raise FolderBusyError(
                f"another batch run is writing to {folder}; wait for it to finish or choose another --output"
            ) from None
        path = folder / RESULTS_NAME
        raw = path.read_bytes() if path.exists() else b""
        lines = raw.split(b"\n")
        torn = bool(lines.pop())  # what follows the last newline: empty unless the last write was cut short
        by_key: dict[tuple[str, str], dict] = {}
        unreadable = superseded = 0
        for line in lines:
            record = _parse_line(line)
            if record is None:
                unreadable += int(bool(line.strip()))
                continue
            superseded += int(record_key(record) in by_key)  # never written by this code; the later one wins
            by_key[record_key(record)] = record
        records = list(by_key.values())
        if drop_failed:
            kept = [record for record in records if record.get("status") != "error"]
            if len(kept) < len(records):
                logger.info("results journal: %d failed record(s) will be retried", len(records) - len(kept))
            records, superseded = kept, superseded + len(records) - len(kept)
        if torn or unreadable:
            logger.warning(
                "results journal: dropped %d incomplete or unreadable line(s) left by an interrupted run",
                int(torn) + unreadable,
            )
        if torn or unreadable or superseded:
            write_atomically(path, b"".join(_encode(record) for record in records))
        elif not path.exists():
            path.touch()
            fsync_directory(folder)
        return cls(path, records, lock_handle)

    @property
    def records(self) -> list[dict]:
        return list(self._records)

    def __iter__(self) -> Iterator[dict]:
        return iter(list(self._records))

    def is_done(self, film_id: str, task: str) -> bool:
        return (film_id, task) in self._keys

    def append(self, record: dict) -> None:
        """Append one record durably (write, flush, fsync) before returning. A key already present is refused."""
        key = record_key(record)
        if key in self._keys:
            raise ValueError(f"record for task {key[1]} of film {key[0]} is already in the journal")
        self._handle.write(_encode(record))
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._records.append(record)
        self._keys.add(key)

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()
        if not self._lock_handle.closed:
            fcntl.flock(self._lock_handle, fcntl.LOCK_UN)
            self._lock_handle.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _finite(value):
    """JSON has no NaN or infinity: such a number (a broken engine's output) is written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _encode(record: dict) -> bytes:
    text = json.dumps(_finite(record), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (text + "\n").encode("utf-8")
