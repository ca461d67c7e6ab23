"""House style gates: ruff on the Python, shellcheck on every script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]


def test_ruff_format_leaves_every_file_as_it_is():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-4000:]


def test_shellcheck_passes_on_every_script():
    scripts = sorted(str(path) for path in (REPO_ROOT / "scripts").glob("*.sh")) + [str(REPO_ROOT / ".ci" / "run")]
    assert len(scripts) >= 8
    shellcheck = Path(sys.executable).with_name("shellcheck")
    result = subprocess.run([str(shellcheck), "-x", *scripts], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]
