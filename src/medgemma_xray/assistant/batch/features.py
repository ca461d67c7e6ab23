"""Image embeddings in shards: one .npy per vision batch, written atomically before the batch's records.

A film's features record names its shard and row; the journal is the index (features/index.csv is a view of it).
A shard is only ever complete (written to a temporary name, fsynced, renamed). A kill -9 after the rename and
before the records leaves an orphan shard, which the next run deletes: those films are computed again.
"""

from __future__ import annotations

import csv
import io
import logging
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from medgemma_xray.assistant.batch.journal import write_atomically
from medgemma_xray.assistant.spreadsheet import row_cells

logger = logging.getLogger(__name__)

FEATURES_DIR = "features"
INDEX_NAME = "index.csv"
_SHARD = re.compile(r"shard-(\d{6})\.npy")


class FeatureShards:
    """Writes the shards of one output folder. Construct it with the shards the journal refers to."""

    def __init__(self, output_dir: Path, referenced: Iterable[str]) -> None:
        self.output_dir = output_dir
        self.folder = output_dir / FEATURES_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        referenced = set(referenced)
        numbers = [-1]
        for path in self.folder.iterdir():
            relative = f"{FEATURES_DIR}/{path.name}"
            match = _SHARD.fullmatch(path.name)
            if path.name.endswith(".tmp") or (match and relative not in referenced):
                path.unlink()  # a shard cut short, or one whose records never made it to the journal
                logger.info("removed an unfinished feature shard from an interrupted run")
            elif match:
                numbers.append(int(match.group(1)))
        self._next = max(numbers) + 1

    def write(self, features: np.ndarray) -> str:
        """Store one batch (films x tokens x hidden, float32); returns the shard's path relative to the output."""
        features = np.ascontiguousarray(features, dtype=np.float32)
        name = f"shard-{self._next:06d}.npy"
        self._next += 1
        buffer = io.BytesIO()
        np.save(buffer, features, allow_pickle=False)
        write_atomically(self.folder / name, buffer.getvalue())
        return f"{FEATURES_DIR}/{name}"


def feature_records(records: Iterable[dict]) -> list[dict]:
    return [r for r in records if r.get("task") == "features" and r.get("status") == "ok"]


def load_features(output_dir: Path, records: Iterable[dict]) -> tuple[list[str], np.ndarray]:
    """(film ids, features stacked in the journal's order) for every film whose features are done."""
    chosen = feature_records(records)
    shards: dict[str, np.ndarray] = {}
    rows = []
    for record in chosen:
        shard = record["result"]["shard"]
        if shard not in shards:
            shards[shard] = np.load(Path(output_dir) / shard, mmap_mode="r", allow_pickle=False)
        rows.append(np.asarray(shards[shard][record["result"]["row"]]))
    if not rows:
        return [], np.zeros((0,), dtype=np.float32)
    return [r["film_id"] for r in chosen], np.stack(rows)


def write_index(output_dir: Path, records: Iterable[dict]) -> Path:
    """features/index.csv: film id, file (where the run records names), shard, row. Regenerated, never appended."""
    chosen = feature_records(records)
    columns = ["film_id", *(["file"] if any("file" in r for r in chosen) else []), "shard", "row"]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for record in chosen:
        row = {"film_id": record["film_id"], "shard": record["result"]["shard"], "row": record["result"]["row"]}
        if "file" in columns:
            row["file"] = record.get("file", "")
        writer.writerow(row_cells(row))
    path = Path(output_dir) / FEATURES_DIR / INDEX_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text.getvalue().encode("utf-8"))
    return path
