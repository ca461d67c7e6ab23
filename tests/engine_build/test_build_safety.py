"""Builds that cannot hurt what is already there: refused before any work, atomic, and honest about their films."""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO_ROOT, WITHOUT_THE_F1_GATE, assert_refused_before_any_work, run_optimizer

pytestmark = pytest.mark.slow


def snapshot(folder) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture()
def previous_bundle(fp32_bundle, tmp_path):
    out = tmp_path / "out" / "bundle"
    shutil.copytree(fp32_bundle, out)
    return out


def build_args(demo_model_dir, films, out, *extra) -> list[str]:
    return [
        "--model_path",
        str(demo_model_dir),
        "--calib_images",
        str(films),
        "--output_path",
        str(out),
        "--target",
        "none",
        "--max_seq_len",
        "512",
        "--max_batch",
        "2",
        *WITHOUT_THE_F1_GATE,
        *extra,
    ]


def test_an_existing_output_is_refused_without_overwrite(demo_model_dir, synthetic_films, previous_bundle):
    before = snapshot(previous_bundle)
    result = run_optimizer(*build_args(demo_model_dir, synthetic_films, previous_bundle, "--allow_few_films"))
    assert result.returncode == 2 and "already exists. Pass --overwrite" in result.stderr
    assert_refused_before_any_work(result.stderr)
    assert snapshot(previous_bundle) == before


def test_a_failed_build_leaves_the_previous_bundle_byte_identical(demo_model_dir, synthetic_films, previous_bundle):
    before = snapshot(previous_bundle)
    result = run_optimizer(
        *build_args(
            demo_model_dir,
            synthetic_films,
            previous_bundle,
            "--allow_few_films",
            "--overwrite",
            "--precision",
            "int8",
            "--min_cosine",
            "0.9999999",
        )
    )
    assert result.returncode == 1
    assert "precision regression: image embedding cosine" in result.stderr and "left as it was" in result.stderr
    assert snapshot(previous_bundle) == before
    assert [p.name for p in previous_bundle.parent.iterdir()] == ["bundle"]  # no staging folder left behind


def test_too_few_real_films_are_refused_and_unreadable_ones_named(demo_model_dir, synthetic_films, tmp_path):
    films = tmp_path / "films"
    shutil.copytree(synthetic_films, films)
    (films / "broken_film.dcm").write_bytes(b"\0" * 128 + b"DICM" + b"not a dataset")
    result = run_optimizer(*build_args(demo_model_dir, films, tmp_path / "out"))
    assert result.returncode == 2
    assert "0 real films (+12 synthetic) for calibration; the minimum is 50" in result.stderr
    assert "--allow_few_films" in result.stderr
    assert "skipped broken_film.dcm:" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max_seq_len", "100", "--max_seq_len 100 is out of range: one film takes 256 tokens"),
        ("--max_batch", "0", "--max_batch 0 is out of range"),
    ],
)
def test_shapes_are_checked_before_any_work(demo_model_dir, synthetic_films, tmp_path, flag, value, message):
    args = build_args(demo_model_dir, synthetic_films, tmp_path / "out", "--allow_few_films")
    args[args.index(flag) + 1] = value
    result = run_optimizer(*args)
    assert result.returncode == 2 and message in result.stderr
    assert_refused_before_any_work(result.stderr)
    assert not (tmp_path / "out").exists()


def test_publish_swaps_a_bundle_whole(tmp_path):
    from medgemma_xray.engine_build.staging import make_staging_dir, publish

    out = tmp_path / "bundle"
    out.mkdir()
    (out / "old.plan").write_text("old")
    staging = make_staging_dir(out)
    (staging / "new.plan").write_text("new")
    with pytest.raises(FileExistsError, match="--overwrite"):
        publish(staging, out, overwrite=False)
    publish(staging, out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"] and [p.name for p in out.iterdir()] == ["new.plan"]
    assert out.stat().st_mode & 0o777 == 0o755 or out.stat().st_mode & 0o005  # readable by a service's user


@pytest.mark.parametrize("precision", ["fp32", "int8", "fp16"])
def test_a_gate_over_too_few_held_out_films_is_refused_before_any_work(
    demo_model_dir, synthetic_films, tmp_path, precision
):
    """7 films used to hold out 2 (10%, at least 2) and gate on them. One rule for every precision now: 10%, at
    least 4, and as many left to calibrate on; --allow_few_films does not lower it."""
    films = tmp_path / "films"
    films.mkdir()
    for path in sorted(synthetic_films.iterdir())[:7]:
        shutil.copy(path, films / path.name)
    args = build_args(demo_model_dir, films, tmp_path / "out", "--allow_few_films", "--precision", precision)
    result = run_optimizer(*args)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "7 films: the accuracy gate holds out 4 (10%, at least 4: fewer is too few to judge" in result.stderr
    assert "[1/4]" not in result.stderr and not (tmp_path / "out").exists()


def start_optimizer(*args: str, stderr_path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "optimize_trt_engine.py", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(stderr_path, "w"),  # noqa: SIM115 (closed with the process)
        text=True,
    )


def wait_for_line(path, text: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in path.read_text():
            return
        assert process.poll() is None, path.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not logged in {timeout_s} s:\n{path.read_text()[-3000:]}")


def test_a_killed_build_leaves_nothing_once_the_next_build_ran(demo_model_dir, synthetic_films, tmp_path):
    """SIGTERM: the build removes its own staging folder. SIGKILL cannot be caught: the next build removes what it
    left (its process no longer runs), and leaves alone the staging folder of a build that still runs."""
    out = tmp_path / "out" / "bundle"
    args = build_args(demo_model_dir, synthetic_films, out, "--allow_few_films")

    terminated = start_optimizer(*args, stderr_path=tmp_path / "terminated.log")
    wait_for_line(tmp_path / "terminated.log", "building in", terminated)
    terminated.send_signal(signal.SIGTERM)
    assert terminated.wait(timeout=120) == 128 + signal.SIGTERM
    assert list(out.parent.iterdir()) == [], "SIGTERM left its staging folder"

    killed = start_optimizer(*args, stderr_path=tmp_path / "killed.log")
    wait_for_line(tmp_path / "killed.log", "building in", killed)
    killed.kill()
    killed.wait(timeout=60)
    left = [path.name for path in out.parent.iterdir()]
    assert len(left) == 1 and left[0].startswith(".bundle.staging-"), left

    following = start_optimizer(*args, stderr_path=tmp_path / "following.log")
    wait_for_line(tmp_path / "following.log", "building in", following)
    following.send_signal(signal.SIGTERM)
    following.wait(timeout=120)
    log = (tmp_path / "following.log").read_text()
    assert f"removed {out.parent / left[0]}, left by a build (process {killed.pid}) that no longer runs" in log
    assert list(out.parent.iterdir()) == []


def test_a_failed_accuracy_check_stops_before_the_f1_gate_and_names_the_remedies(
    demo_model_dir, synthetic_films, tmp_path
):
    """The long case misses an (impossible) KL bound: the build stops there, the F1 gate never starts, and the
    message says what to do and what each remedy costs."""
    out = tmp_path / "out" / "bundle"
    args = build_args(demo_model_dir, synthetic_films, out, "--allow_few_films", "--precision", "int8")
    args[args.index("--task_phantoms") + 1] = "24"  # the F1 gate on, as by default
    result = run_optimizer(*args, "--max_long_kl", "1e-12")
    assert result.returncode == 1, result.stderr[-3000:]
    error = result.stderr
    assert "precision regression: long conversation" in error and "largest KL (at answer position" in error
    assert "the F1 gate was not run" in error and "F1 gate, pytorch" not in error
    assert "Remedies: build another precision (--precision fp16 or fp32: fp16 halves the weights" in error
    assert "or accept the drift with a lower --min_long_token_agreement" in error
    assert "marks the threshold as lowered" in error
    assert not out.exists() and list(out.parent.iterdir()) == []
