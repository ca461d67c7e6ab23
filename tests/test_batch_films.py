"""batch_films.py as a real process: 20 synthetic films, every task, recorded failures, and a resume after kill -9."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from medgemma_xray.assistant.batch.features import load_features
from medgemma_xray.assistant.report_schema import REPORT_FIELDS
from medgemma_xray.phantoms.films import (
    COMPRESSED_SYNTAXES,
    UNCOMPRESSED_SYNTAXES,
    chest_phantom,
    dicom_bytes,
    png_bytes,
    quantize,
)
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.loader import MAX_UPLOAD_BYTES
from medgemma_xray.xray_io.preprocess import model_input_image
from tests.conftest import ISOLATED_VARIABLES, REPO_ROOT

pytestmark = pytest.mark.slow

SIZE = (256, 224)  # small films: the test is about the pipeline, not the pixels
SECRET_NAME, SECRET_PATIENT, SECRET_ID = "ZZSECRETNAME", "ZZSECRET^PATIENT", "PID-7731-SECRET"
QUESTIONS = "# one question per line\nIs there a pneumothorax?\n\nDescribe the heart size.\n"
MAX_NEW_TOKENS = "6"


def film(seed: int, bits: int = 12) -> np.ndarray:
    return quantize(chest_phantom(*SIZE, seed=seed), bits)


def write_twenty_films(folder: Path) -> dict[str, str]:
    """17 readable films (9 DICOM transfer syntaxes, MONOCHROME1, AP, PNG 8/16-bit, JPEG) and 3 that fail.
    Returns {relative path: expected error class} for the three."""
    seed = iter(range(100))
    for name, syntax in {**UNCOMPRESSED_SYNTAXES, **COMPRESSED_SYNTAXES}.items():
        bits = 8 if syntax == COMPRESSED_SYNTAXES["jpeg-baseline"] else 12
        data = dicom_bytes(film(next(seed), bits), bits_stored=bits, transfer_syntax=name, window=None)
        (folder / "dicom" / f"{name}.dcm").parent.mkdir(parents=True, exist_ok=True)
        (folder / "dicom" / f"{name}.dcm").write_bytes(data)
    (folder / "ward" / "icu").mkdir(parents=True)
    inverted = 4095 - film(next(seed))
    (folder / "ward" / "mono1.dcm").write_bytes(dicom_bytes(inverted, bits_stored=12, photometric="MONOCHROME1"))
    (folder / "ward" / "icu" / "portable").write_bytes(
        dicom_bytes(film(next(seed)), bits_stored=12, view_position="AP")
    )
    (folder / f"{SECRET_NAME}_{SECRET_ID}.dcm").write_bytes(
        dicom_bytes(film(next(seed)), bits_stored=12, patient_name=SECRET_PATIENT, patient_id=SECRET_ID)
    )
    for index in range(3):
        (folder / "png" / f"film{index}.png").parent.mkdir(exist_ok=True)
        (folder / "png" / f"film{index}.png").write_bytes(png_bytes(film(next(seed), 8)))
    (folder / "png" / "sixteen.png").write_bytes(png_bytes(film(next(seed), 16)))
    from PIL import Image

    Image.fromarray(film(next(seed), 8)).save(folder / "photo.jpg", quality=90)
    whole = dicom_bytes(film(next(seed)), bits_stored=12)
    (folder / "broken" / "truncated.dcm").parent.mkdir()
    (folder / "broken" / "truncated.dcm").write_bytes(whole[: len(whole) // 2])
    (folder / "broken" / "head_ct.dcm").write_bytes(dicom_bytes(film(next(seed)), bits_stored=12, modality="CT"))
    with open(folder / "broken" / "huge.dcm", "wb") as handle:  # sparse: takes no disk, fails on its size
        handle.write(whole)
        handle.truncate(MAX_UPLOAD_BYTES + 1)
    return {
        "broken/truncated.dcm": "CorruptImageError",
        "broken/head_ct.dcm": "UnsupportedImageError",
        "broken/huge.dcm": "FilmTooLarge",  # refused by the film intake from its size, before reading
    }


def batch_command(films: Path, out: Path, questions: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "batch_films.py",
        "--task",
        "all",
        "--input",
        str(films),
        "--output",
        str(out),
        "--questions",
        str(questions),
        "--max_new_tokens",
        MAX_NEW_TOKENS,
        "--batch_size",
        "2",
        *extra,
    ]


def environment(random_weights: bool = True) -> dict:
    """By default the random-weight model: these tests count tokens of answers that run to --max_new_tokens."""
    from tests.conftest import REPO_ROOT

    clean = {key: value for key, value in os.environ.items() if key not in ISOLATED_VARIABLES}
    return {**clean, "MODEL_PATH": str(REPO_ROOT / "models" / "medgemma-random")} if random_weights else clean


def journal_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_twenty_films_all_tasks_recorded_failures_and_resume_after_sigkill(tmp_path, random_model_dir):
    films, out = tmp_path / "films", tmp_path / "out"
    failing = write_twenty_films(films)
    relatives = sorted(p.relative_to(films).as_posix() for p in films.rglob("*") if p.is_file())
    assert len(relatives) == 20
    questions = tmp_path / "questions.txt"
    questions.write_text(QUESTIONS)
    expected_records = 20 * 3

    # 1. Start, and kill -9 once about a third of the records are in.
    killed = subprocess.Popen(
        batch_command(films, out, questions, "--no_progress"),
        cwd=REPO_ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while len(journal_lines(out / "results.jsonl")) < expected_records // 3:
        assert killed.poll() is None, f"the run ended before it could be killed: {killed.stderr.read()[-2000:]!r}"
        assert time.monotonic() < deadline, "no progress within 300 s"
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    first_out, first_err = killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    before = journal_lines(out / "results.jsonl")
    assert expected_records // 3 <= len(before) < expected_records
    # A kill during a write leaves a partial last line; make sure there is one (a kill between two writes does not).
    with open(out / "results.jsonl", "a") as handle:
        handle.write('{"film_id": "0123456789abcdef0123", "task": "rep')

    # 2. The same command resumes and finishes; three films fail, so the exit status is 1.
    resumed = subprocess.run(
        batch_command(films, out, questions),
        cwd=REPO_ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    assert "dropped 1 incomplete or unreadable line(s)" in resumed.stderr
    assert "films/s" in resumed.stderr  # the tqdm bar: rate and time left ("<00:01")
    assert "<" in resumed.stderr
    complete = sum(1 for n in Counter(json.loads(line)["film_id"] for line in before).values() if n == 3)
    assert f"films: 20 found, {complete} already done, {20 - complete} processed now" in resumed.stdout
    reasons = "UnsupportedImageError 1, FilmTooLarge 1, CorruptImageError 1"
    assert f"failed films in this folder: 3; by reason: {reasons}" in resumed.stdout
    assert "films/s" in resumed.stdout and "tokens/s" in resumed.stdout

    # 3. The journal: every film once per task, the killed run's records kept as they were, no torn line.
    lines = journal_lines(out / "results.jsonl")
    records = [json.loads(line) for line in lines]
    assert lines[: len(before)] == before  # nothing rewritten or lost from before the kill
    keys = [(r["film_id"], r["task"]) for r in records]
    assert len(keys) == len(set(keys)) == expected_records
    by_file: dict[str, dict[str, dict]] = {}
    for record in records:
        by_file.setdefault(record["file"], {})[record["task"]] = record
    assert sorted(by_file) == relatives and all(
        set(tasks) == {"features", "report", "qa"} for tasks in by_file.values()
    )
    for relative, error_class in failing.items():
        for record in by_file[relative].values():
            assert record["status"] == "error" and record["error"]["class"] == error_class
    assert "modality is CT" in by_file["broken/head_ct.dcm"]["report"]["error"]["message"]
    assert "larger than the 256 MiB limit" in by_file["broken/huge.dcm"]["qa"]["error"]["message"]
    assert "could not be decoded" in by_file["broken/truncated.dcm"]["features"]["error"]["message"]
    good = [relative for relative in relatives if relative not in failing]
    assert by_file["ward/icu/portable"]["report"]["film"]["view_position"] == "AP"
    assert any("inverted" in w for w in by_file["ward/mono1.dcm"]["features"]["film"]["warnings"])
    assert "JPEG 2000" in by_file["dicom/jpeg-2000.dcm"]["report"]["film"]["source"]

    for relative in good:
        report = by_file[relative]["report"]
        assert report["status"] == "ok", report
        result = report["result"]
        assert list(result["fields"]) == [f.key for f in REPORT_FIELDS]
        assert set(result["unfilled"]) == {k for k, v in result["fields"].items() if not v}
        assert result["new_tokens"] == int(MAX_NEW_TOKENS) == result["overall_confidence"]["tokens"]
        assert 0.0 < result["overall_confidence"]["mean_probability"] <= 1.0
        exported = json.loads((out / result["exports"]["json"]).read_text())
        assert exported["raw_text"] == result["text"] and exported["metadata"]["file"] == relative
        assert (out / result["exports"]["markdown"]).read_text().startswith("# Chest X-ray report")
        qa = by_file[relative]["qa"]
        assert qa["status"] == "ok" and [a["question"] for a in qa["result"]["answers"]] == [
            "Is there a pneumothorax?",
            "Describe the heart size.",
        ]
        assert all(a["confidence"]["tokens"] == int(MAX_NEW_TOKENS) for a in qa["result"]["answers"])

    # 4. Every feature present, once, in the film's own row; no shard left that no record names.
    ids, features = load_features(out, records)
    id_of = {r["file"]: r["film_id"] for r in records}
    assert sorted(ids) == sorted(id_of[relative] for relative in good)
    assert features.shape == (17, 256, 128) and np.isfinite(features).all()
    referenced = {r["result"]["shard"] for r in records if r["task"] == "features" and r["status"] == "ok"}
    assert {f"features/{p.name}" for p in (out / "features").glob("*.npy")} == referenced
    index = list(csv.DictReader((out / "features" / "index.csv").open()))
    assert [row["film_id"] for row in index] == ids
    from medgemma_xray.pytorch_backend.eager import TorchInference

    backend = TorchInference(random_model_dir, device="cpu")
    try:
        early, late = good[0], good[-1]  # one done before the kill, one after it
        assert any(json.loads(line)["file"] == early for line in before)
        assert not any(json.loads(line)["file"] == late and json.loads(line)["task"] == "features" for line in before)
        for relative in (early, late):
            direct = backend.image_features([model_input_image(load_radiograph(films / relative))])[0]
            np.testing.assert_allclose(features[ids.index(id_of[relative])], direct, atol=1e-4)
    finally:
        backend.close()

    # 5. The CSV is the JSONL's view: one row per record, one per question for qa.
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 20 + 20 + 17 * 2 + 3
    assert {(r["film_id"], r["task"]) for r in rows} == set(keys)
    csv_reports = {r["file"]: r for r in rows if r["task"] == "report"}
    for relative in good:
        result = by_file[relative]["report"]["result"]
        assert csv_reports[relative]["text"] == result["text"]
        assert float(csv_reports[relative]["confidence"]) == pytest.approx(
            result["overall_confidence"]["mean_probability"], abs=1e-4
        )
    assert csv_reports["broken/head_ct.dcm"]["error_class"] == "UnsupportedImageError"

    # 6. Logs and console never name a film or carry a DICOM identifier.
    console = first_out.decode() + first_err.decode() + resumed.stdout + resumed.stderr
    for text in (SECRET_NAME, SECRET_PATIENT, SECRET_ID, *(Path(r).name for r in relatives)):
        assert text not in console, text


def test_dicom_to_png_is_deidentified_and_uses_the_uis_windowing(tmp_path):
    films, out = tmp_path / "films", tmp_path / "out"
    films.mkdir()
    mono1 = dicom_bytes(
        4095 - film(1),
        bits_stored=12,
        photometric="MONOCHROME1",
        patient_name=SECRET_PATIENT,
        patient_id=SECRET_ID,
        window=(2048, 3000),
    )
    (films / f"{SECRET_NAME}.dcm").write_bytes(mono1)
    (films / "j2k.dcm").write_bytes(
        dicom_bytes(
            film(2),
            bits_stored=12,
            transfer_syntax="jpeg-2000-lossless",
            view_position="AP",
            patient_name=SECRET_PATIENT,
        )
    )
    (films / "already.png").write_bytes(png_bytes(film(3, 8)))
    (films / "ct.dcm").write_bytes(dicom_bytes(film(4), bits_stored=12, modality="CT", patient_name=SECRET_PATIENT))
    command = [sys.executable, "batch_films.py", "--task", "dicom-to-png", "--input", str(films), "--output", str(out)]
    result = subprocess.run(command, cwd=REPO_ROOT, env=environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr  # the CT is refused
    assert "1 skipped" in result.stdout and SECRET_NAME not in result.stdout + result.stderr

    rows = list(csv.DictReader((out / "results.csv").open()))
    assert list(rows[0]) == [
        "film_id",
        "task",
        "status",
        "error_class",
        "error_message",
        "reason",
        "png",
        "view",
        "modality",
        "rows",
        "columns",
        "transfer_syntax",
    ]
    by_status = sorted((r["status"], r["transfer_syntax"], r["view"]) for r in rows)
    assert by_status == [
        ("error", "", ""),
        ("ok", "Explicit VR Little Endian", "PA"),
        ("ok", "JPEG 2000 Image Compression (Lossless Only)", "AP"),
        ("skipped", "", ""),
    ]
    assert next(r for r in rows if r["status"] == "skipped")["reason"] == "not a DICOM file"
    error = next(r for r in rows if r["status"] == "error")
    assert "modality is CT" in error["error_message"] and "ct.dcm" not in error["error_message"]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all("file" not in record for record in records)

    from PIL import Image

    expected = {
        "Explicit VR Little Endian": load_radiograph(mono1).pixels,
        "JPEG 2000 Image Compression (Lossless Only)": load_radiograph((films / "j2k.dcm").read_bytes()).pixels,
    }
    for row in (r for r in rows if r["status"] == "ok"):
        png = out / row["png"]
        assert png.name == f"{row['film_id']}.png" and len(row["film_id"]) == 20
        data = png.read_bytes()
        chunks = _png_chunk_types(data)
        assert chunks[0] == "IHDR" and not {"tEXt", "iTXt", "zTXt", "eXIf", "tIME"} & set(chunks), chunks
        with Image.open(png) as image:
            assert image.mode == "L" and not image.info
            np.testing.assert_array_equal(np.asarray(image), expected[row["transfer_syntax"]])
        assert (int(row["rows"]), int(row["columns"])) == SIZE and row["modality"] == "DX"
    for path in out.rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            for secret in (SECRET_NAME, SECRET_PATIENT, SECRET_ID, "Synthetic^Phantom"):
                assert secret.encode() not in content, (path.name, secret)

    # Asked for, the mapping to the source files is kept, in this run's own records only.
    named = subprocess.run(
        [*command[:-1], str(tmp_path / "named"), "--file_names", "record"],
        cwd=REPO_ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert named.returncode == 1
    named_rows = list(csv.DictReader((tmp_path / "named" / "results.csv").open()))
    assert sorted(r["file"] for r in named_rows) == sorted(["already.png", "ct.dcm", "j2k.dcm", f"{SECRET_NAME}.dcm"])
    assert SECRET_NAME not in named.stdout + named.stderr


def _png_chunk_types(data: bytes) -> list[str]:
    types, position = [], 8
    while position < len(data):
        length = int.from_bytes(data[position : position + 4], "big")
        types.append(data[position + 4 : position + 8].decode("ascii"))
        position += 12 + length
    return types


def test_bad_use_is_refused_with_a_reason(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "batch_films.py", *args],
            cwd=REPO_ROOT,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    missing = run("--task", "report", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out"))
    assert missing.returncode == 2 and "is not a folder" in missing.stderr
    (tmp_path / "films").mkdir()
    empty_questions = tmp_path / "q.txt"
    empty_questions.write_text("# nothing\n\n")
    no_questions = run(
        "--task",
        "qa",
        "--input",
        str(tmp_path / "films"),
        "--output",
        str(tmp_path / "out"),
        "--questions",
        str(empty_questions),
    )
    assert no_questions.returncode == 2 and "no questions found" in no_questions.stderr
    for args, message in (
        (["--task", "qa"], "--task qa needs --questions"),
        (["--task", "report", "--max_new_tokens", "0"], "--max_new_tokens must be 1.."),
    ):
        refused = run(*args, "--input", str(tmp_path / "films"), "--output", str(tmp_path / "out"))
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / ".film_key").write_text("")  # a key file cut short
    damaged = run("--task", "dicom-to-png", "--input", str(tmp_path / "films"), "--output", str(tmp_path / "out"))
    assert damaged.returncode == 2 and ".film_key is damaged" in damaged.stderr


def test_trt_mode_gives_the_same_features_as_pytorch(tmp_path, request):
    bundle = request.getfixturevalue("int8_bundle")
    films = tmp_path / "films"
    films.mkdir()
    for seed in range(3):
        (films / f"f{seed}.png").write_bytes(png_bytes(film(seed, 8)))
    features = {}
    for mode, extra in (("pytorch", []), ("trt", ["--mode", "trt", "--engine_path", str(bundle)])):
        out = tmp_path / mode
        command = [
            sys.executable,
            "batch_films.py",
            "--task",
            "features",
            "--input",
            str(films),
            "--output",
            str(out),
            "--no_progress",
            *extra,
        ]
        result = subprocess.run(
            command, cwd=REPO_ROOT, env=environment(random_weights=False), capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stderr[-3000:]
        records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        ids, array = load_features(out, records)
        file_of = {r["film_id"]: r["file"] for r in records}
        features[mode] = {file_of[film_id]: row for film_id, row in zip(ids, array, strict=True)}
    assert len(features["pytorch"]) == len(features["trt"]) == 3
    for name, torch_row in features["pytorch"].items():
        trt_row = features["trt"][name]
        cosine = float(np.dot(torch_row.ravel(), trt_row.ravel()) / np.linalg.norm(torch_row) / np.linalg.norm(trt_row))
        assert cosine > 0.995, (name, cosine)


def test_hostile_files_neither_stop_the_batch_nor_leak_identifiers(tmp_path, random_model_dir):
    """One bad file never stops the run; identifiers in names and tags never reach the console, and in the results
    only the operator's own relative path names a film."""
    import io

    import pydicom

    from devtools.hostile_files import FAKE_IDENTIFIERS, FAKE_IDENTIFYING_FILE_NAME, dicom_rle_bomb, png_bomb

    def identified(**changes) -> bytes:
        data = dicom_bytes(quantize(chest_phantom(seed=6), 12), bits_stored=12, window=(2048, 4096))
        dataset = pydicom.dcmread(io.BytesIO(data))
        for keyword, value in {**FAKE_IDENTIFIERS, **changes}.items():
            setattr(dataset, keyword, value)
        buffer = io.BytesIO()
        dataset.save_as(buffer, enforce_file_format=True)
        return buffer.getvalue()

    films, out = tmp_path / "films", tmp_path / "out"
    films.mkdir()
    files = {
        "good.dcm": identified(),
        "window-width-0.dcm": identified(WindowWidth="0"),
        "bits-contradict.dcm": identified(BitsAllocated=8),
        "ct.dcm": identified(Modality="CT"),
        "bomb.png": png_bomb(13000, 13000),
        "bomb-rle.dcm": dicom_rle_bomb(20000, 20000),
        "headerless.dcm": identified()[132:],
    }
    for name, content in files.items():
        (films / f"{FAKE_IDENTIFYING_FILE_NAME}_{name}").write_bytes(content)
    result = subprocess.run(
        [
            sys.executable,
            "batch_films.py",
            "--task",
            "report",
            "--input",
            str(films),
            "--output",
            str(out),
            "--max_new_tokens",
            "4",
            "--no_progress",
        ],
        cwd=REPO_ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    markers = ["ZZTESTPATIENT", "SECRETNAME", "PID-7731", *FAKE_IDENTIFIERS.values()]
    console = result.stdout + result.stderr
    assert [line for line in console.splitlines() if any(marker in line for marker in markers)] == []
    assert "Traceback" not in console
    records = [json.loads(line) for line in journal_lines(out / "results.jsonl")]
    assert len(records) == 7
    for record in records:  # the "file" field is the operator's own relative path; nothing else names the film
        text = json.dumps({key: value for key, value in record.items() if key != "file"})
        assert [marker for marker in markers if marker in text] == [], record
    errors = {r["file"].split("_")[-1]: r["error"] for r in records if r["status"] == "error"}
    assert set(errors) == {"bits-contradict.dcm", "ct.dcm", "bomb.png", "bomb-rle.dcm"}
    assert "the limit is 40 Mpx" in errors["bomb.png"]["message"]
    assert "the limit is 40 Mpx" in errors["bomb-rle.dcm"]["message"]


def test_with_the_film_check_at_warn_an_implausible_film_is_read_flagged_and_the_run_exits_1(
    tmp_path, random_model_dir
):
    """FILM_CHECK=warn: noise is read (its answers recorded) but flagged in its record and in the summary, and the
    run exits 1, so no script takes the folder's results as clean (with the default, refuse, it is an error record:
    tests/test_front_door_conformance.py)."""
    from medgemma_xray.film_check.negatives import negative_film

    films, out = tmp_path / "films", tmp_path / "out"
    films.mkdir()
    (films / "chest.png").write_bytes(png_bytes(film(1, 8)))
    (films / "noise.png").write_bytes(png_bytes(quantize(negative_film("noise", seed=3), 8)))
    questions = tmp_path / "questions.txt"
    questions.write_text("Is there an effusion?\n")
    done = subprocess.run(
        [arg if arg != "all" else "qa" for arg in batch_command(films, out, questions, "--no_progress")],
        cwd=REPO_ROOT,
        env={**environment(), "FILM_CHECK": "warn"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "flagged films: 1 do not look like frontal chest films" in done.stdout, done.stdout
    records = {json.loads(line)["file"]: json.loads(line) for line in journal_lines(out / "results.jsonl")}
    assert records["noise.png"]["status"] == "ok" and records["noise.png"]["film"]["flagged"] is True
    assert "not meaningful" in records["noise.png"]["film"]["warnings"][-1]
    assert records["chest.png"]["film"]["flagged"] is False
