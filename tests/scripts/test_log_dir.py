"""A shared LOG_DIR: the scripts run as real processes against a LOG_DIR that others may
write to, that another user owns, or that holds planted symbolic links; what a start creates is private; and
stop_gradio.sh never stops the server of another LOG_DIR whose PID file was copied in."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.scripts.harness import Operator

pytestmark = pytest.mark.slow


def refused_start(log_dir: Path) -> tuple[int, str]:
    op = Operator(log_dir, free_port())
    done = op.run("start_gradio.sh", "--timeout", "120")
    if done.returncode == 0:  # the old scripts started it: stop it again
        op.cleanup()
    return done.returncode, done.stderr


def test_a_log_dir_others_may_write_to_is_refused(tmp_path):
    log_dir = tmp_path / "shared"
    log_dir.mkdir()
    log_dir.chmod(0o1777)
    code, error = refused_start(log_dir)
    assert code == 2, error
    assert "writable by others (mode 1777)" in error and "chmod 700" in error
    assert list(log_dir.iterdir()) == []  # nothing was written there


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the folder to another user")
def test_a_log_dir_of_another_user_is_refused(tmp_path):
    log_dir = tmp_path / "theirs"
    log_dir.mkdir(mode=0o700)
    shutil.chown(log_dir, "nobody")
    code, error = refused_start(log_dir)
    assert code == 2, error
    assert "belongs to nobody" in error


def test_a_planted_symlink_is_never_followed(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (log_dir / "gradio_app.console.log").symlink_to(victim)
    code, error = refused_start(log_dir)
    assert code == 2, error
    assert "is a symbolic link" in error
    assert victim.read_text() == "precious\n"


def test_a_log_dir_that_is_a_planted_symlink_is_refused_and_nothing_is_written(tmp_path):
    """Another user's link in a shared folder, pointing at a private folder of ours: followed, it sent the control
    socket, token, logs and uploads there."""
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    planted = tmp_path / "medgemma-logs"
    planted.symlink_to(target)
    code, error = refused_start(planted)
    assert code == 2, error
    assert f"{planted} is a symbolic link" in error and f"LOG_DIR to the real folder, {target}" in error
    assert list(target.iterdir()) == []


def test_a_symlink_above_the_log_dir_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "via").symlink_to(real)
    code, error = refused_start(tmp_path / "via" / "logs")
    assert code == 2, error
    assert f"{tmp_path / 'via'} is a symbolic link" in error
    assert list(real.iterdir()) == []


def test_a_folder_above_the_log_dir_that_others_may_write_to_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    code, error = refused_start(shared / "logs")
    assert code == 2, error
    assert f"the folder {shared} above it is writable by others (mode 777) and not sticky" in error
    assert list(shared.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the folder to another user")
def test_a_sticky_shared_folder_of_another_user_above_the_log_dir_is_refused(tmp_path):
    shared = tmp_path / "theirs"
    shared.mkdir()
    shared.chmod(0o1777)
    shutil.chown(shared, "nobody")
    code, error = refused_start(shared / "logs")
    assert code == 2, error
    assert "writable by others and belongs to nobody" in error
    assert list(shared.iterdir()) == []


def test_files_are_private_and_stop_ignores_a_copied_pid_file(tmp_path):
    first, second = tmp_path / "first" / "logs", tmp_path / "second"
    second.mkdir(mode=0o700)
    op = Operator(first, free_port())
    op.env["UMASK_NOTE"] = "the operator's umask is 022 here"
    try:
        os.umask(0o022)
        started = op.run("start_gradio.sh")
        assert started.returncode == 0, started.stdout + started.stderr
        assert stat.S_IMODE(first.stat().st_mode) == 0o700
        for name in ("gradio_app.pid", "gradio_app.lock", "gradio_app.console.log", "gradio_app.log"):
            assert stat.S_IMODE((first / name).stat().st_mode) == 0o600, name
        pid = op.pid()

        shutil.copy(first / "gradio_app.pid", second / "gradio_app.pid")
        other = Operator(second, free_port())
        stopped = other.run("stop_gradio.sh", "--timeout", "20")
        assert stopped.returncode == 0, stopped.stderr
        assert "not running" in stopped.stdout
        assert Path(f"/proc/{pid}").exists() and op.pid() == pid  # the first server still runs
        assert op.status_json()["running"] is True
    finally:
        op.cleanup()


def test_the_server_itself_refuses_a_planted_log_dir_link_when_run_without_the_scripts(tmp_path):
    """app.py run directly (a container, the Ray ingress) applies the same rule before it writes its socket,
    token or upload cache."""
    import subprocess
    import sys

    from tests.conftest import ISOLATED_VARIABLES, REPO_ROOT

    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    planted = tmp_path / "medgemma-logs"
    planted.symlink_to(target)
    env = {key: value for key, value in os.environ.items() if key not in ISOLATED_VARIABLES}
    env["LOG_DIR"] = str(planted)
    done = subprocess.run(
        [sys.executable, "app.py", "--port", str(free_port())],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{planted} is a symbolic link" in done.stderr
    assert list(target.iterdir()) == []
