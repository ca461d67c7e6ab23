"""batch_films.py as a process on a folder with good and bad files."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
import pytest

from devtools.phantoms import chest_phantom, dicom_bytes, png_bytes, quantize
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture()
def mixed_folder(tmp_path):
    folder = tmp_path / "films"
    (folder / "ward").mkdir(parents=True)
    (folder / "a.png").write_bytes(png_bytes(quantize(chest_phantom(seed=1), 8)))
    (folder / "ward" / "b.dcm").write_bytes(dicom_bytes(quantize(chest_phantom(seed=2), 12), bits_stored=12))
    (folder / "c").write_bytes(dicom_bytes(quantize(chest_phantom(seed=3), 12), bits_stored=12, view_position="AP"))
    (folder / "head_ct.dcm").write_bytes(
        dicom_bytes(quantize(chest_phantom(seed=4), 12), bits_stored=12, modality="CT")
    )
    (folder / "notes.txt").write_text("not a film")
    return folder


def run_batch(*args):
    return subprocess.run(
        [sys.executable, "batch_films.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )


def test_reports_and_features_for_a_mixed_folder(mixed_folder, tmp_path, demo_model_dir, int8_bundle):
    out = tmp_path / "out"
    result = run_batch("--input", str(mixed_folder), "--output", str(out), "--task", "both", "--max_new_tokens", "8")
    assert result.returncode == 1, result.stderr[-3000:]  # two files could not be read
    assert "3 films done, 2 failed" in result.stdout
    rows = {row["file"]: row for row in csv.DictReader((out / "summary.csv").open())}
    assert set(rows) == {"a.png", "c", "head_ct.dcm", "notes.txt", "ward/b.dcm"}
    assert rows["head_ct.dcm"]["status"] == "error" and "modality is CT" in rows["head_ct.dcm"]["error"]
    assert rows["notes.txt"]["status"] == "error" and "not a PNG, JPEG or DICOM" in rows["notes.txt"]["error"]
    assert rows["c"]["view_position"] == "AP" and "not PA" in rows["c"]["warnings"]
    reports = sorted(p.name for p in (out / "reports").iterdir())
    assert reports == ["a.png.md", "c.md", "ward__b.dcm.md"]
    for report in (out / "reports").iterdir():
        text = report.read_text()
        assert "### Findings\n" in text and "### Impression\n" in text
    features = np.load(out / "features.npy")
    assert features.shape == (3, 256, 128) and np.isfinite(features).all()
    assert not np.allclose(features[0], features[1])  # different films, different embeddings

    again = run_batch("--input", str(mixed_folder), "--output", str(out), "--task", "report", "--max_new_tokens", "8")
    assert "skipped" in again.stdout and "3 skipped" in again.stdout  # a rerun keeps finished reports

    trt_out = tmp_path / "trt"
    trt = run_batch("--input", str(mixed_folder), "--output", str(trt_out), "--task", "features", "--mode", "trt",
                    "--engine_path", str(int8_bundle))  # fmt: skip
    assert trt.returncode == 1, trt.stderr[-3000:]
    trt_features = np.load(trt_out / "features.npy")
    cosines = [
        float(np.dot(a.ravel(), b.ravel()) / np.linalg.norm(a) / np.linalg.norm(b))
        for a, b in zip(features, trt_features, strict=True)
    ]
    assert min(cosines) > 0.995


def test_missing_input_folder_is_a_usage_error(tmp_path):
    result = run_batch("--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out"))
    assert result.returncode == 2 and "is not a folder" in result.stderr


def test_hostile_files_neither_stop_the_batch_nor_leak_identifiers(tmp_path, demo_model_dir):
    """One bad file never stops the run; identifiers in names and tags never reach the console or the texts."""
    import io

    import pydicom

    from devtools.hostile_files import FAKE_IDENTIFIERS, FAKE_IDENTIFYING_FILE_NAME, dicom_rle_bomb, png_bomb

    def identified(**changes) -> bytes:
        dataset = pydicom.dcmread(io.BytesIO(dicom_bytes(quantize(chest_phantom(seed=6), 12), bits_stored=12,
                                                         window=(2048, 4096))))  # fmt: skip
        for keyword, value in {**FAKE_IDENTIFIERS, **changes}.items():
            setattr(dataset, keyword, value)
        buffer = io.BytesIO()
        dataset.save_as(buffer, enforce_file_format=True)
        return buffer.getvalue()

    folder = tmp_path / "films"
    folder.mkdir()
    files = {
        "good.dcm": identified(), "window-width-0.dcm": identified(WindowWidth="0"),
        "bits-contradict.dcm": identified(BitsAllocated=8), "ct.dcm": identified(Modality="CT"),
        "bomb.png": png_bomb(13000, 13000), "bomb-rle.dcm": dicom_rle_bomb(20000, 20000),
        "headerless.dcm": identified()[132:],
    }  # fmt: skip
    for name, content in files.items():
        (folder / f"{FAKE_IDENTIFYING_FILE_NAME}_{name}").write_bytes(content)
    out = tmp_path / "out"
    result = run_batch("--input", str(folder), "--output", str(out), "--task", "report", "--max_new_tokens", "4")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "3 films done, 4 failed" in result.stdout
    markers = ["ZZTESTPATIENT", "SECRETNAME", "PID-7731", *FAKE_IDENTIFIERS.values()]
    console = result.stdout + result.stderr
    leaks = [line for line in console.splitlines() if any(marker in line for marker in markers)]
    assert leaks == []
    assert "Traceback" not in console
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert len(rows) == 7
    for row in rows:  # the file column is the operator's own relative path; nothing else names the film
        texts = " ".join(value for key, value in row.items() if key != "file")
        assert [marker for marker in markers if marker in texts] == [], row
    errors = {row["file"].split("_")[-1]: row["error"] for row in rows if row["status"] == "error"}
    assert set(errors) == {"bits-contradict.dcm", "ct.dcm", "bomb.png", "bomb-rle.dcm"}
    assert "the limit is 40 Mpx" in errors["bomb.png"] and "the limit is 40 Mpx" in errors["bomb-rle.dcm"]
    for report in (out / "reports").iterdir():
        assert [marker for marker in FAKE_IDENTIFIERS.values() if marker in report.read_text()] == []
