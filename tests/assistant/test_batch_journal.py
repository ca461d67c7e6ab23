"""The results journal: durable appends, a torn tail dropped on open, one writer per folder, failed records retried."""

from __future__ import annotations

import json

import pytest

from medgemma_xray.assistant.batch.journal import FolderBusyError, Journal


def record(film_id: str, task: str = "report", status: str = "ok", **extra) -> dict:
    return {"film_id": film_id, "task": task, "status": status, **extra}


def test_appends_survive_reopening_and_a_key_is_never_written_twice(tmp_path):
    with Journal.open(tmp_path) as journal:
        journal.append(record("a"))
        journal.append(record("a", "qa"))
        with pytest.raises(ValueError, match="already in the journal"):
            journal.append(record("a"))
    with Journal.open(tmp_path) as journal:
        assert journal.is_done("a", "report") and journal.is_done("a", "qa") and not journal.is_done("b", "report")
        assert [(r["film_id"], r["task"]) for r in journal] == [("a", "report"), ("a", "qa")]
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 2


def test_a_torn_last_line_and_an_unreadable_line_are_dropped_and_the_rest_kept(tmp_path, caplog):
    good = [json.dumps(record(name)) for name in ("a", "b")]
    (tmp_path / "results.jsonl").write_text(good[0] + "\nnot json\n" + good[1] + '\n{"film_id": "c", "ta')
    with Journal.open(tmp_path) as journal:
        assert [r["film_id"] for r in journal] == ["a", "b"] and not journal.is_done("c", "report")
        journal.append(record("c"))
    assert "dropped 2 incomplete or unreadable line(s)" in caplog.text
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["film_id"] for line in lines] == ["a", "b", "c"]


def test_retry_failed_drops_failed_records_so_they_are_redone_once(tmp_path):
    with Journal.open(tmp_path) as journal:
        journal.append(record("a"))
        journal.append(record("b", status="error", error={"class": "RuntimeError", "message": "x"}))
    with Journal.open(tmp_path, drop_failed=True) as journal:
        assert journal.is_done("a", "report") and not journal.is_done("b", "report")
        journal.append(record("b"))
    with Journal.open(tmp_path) as journal:
        assert [(r["film_id"], r["status"]) for r in journal] == [("a", "ok"), ("b", "ok")]


def test_one_writer_per_folder(tmp_path):
    with Journal.open(tmp_path), pytest.raises(FolderBusyError, match="another batch run is writing"):
        Journal.open(tmp_path)
    Journal.open(tmp_path).close()  # released on close


def test_non_finite_numbers_are_written_as_null(tmp_path):
    with Journal.open(tmp_path) as journal:
        journal.append(record("a", result={"confidence": float("nan"), "values": [1.0, float("inf")]}))
    assert json.loads((tmp_path / "results.jsonl").read_text())["result"] == {"confidence": None, "values": [1.0, None]}
