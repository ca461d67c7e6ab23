"""The login file: written 0600 by the CLI, hashes not passwords, loose permissions refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from medgemma_xray.web.http_auth import authenticator, read_credentials
from tests.conftest import REPO_ROOT


def add_user(path, user: str, password: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "medgemma_xray.web.http_auth", "add", "--file", str(path), "--user", user],
        cwd=REPO_ROOT,
        input=password + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_writes_a_private_file_of_hashes_that_checks_passwords(tmp_path):
    path = tmp_path / "credentials"
    assert add_user(path, "teacher", "correct horse battery").returncode == 0
    assert add_user(path, "resident", "another passphrase").returncode == 0
    assert add_user(path, "teacher", "a changed password").returncode == 0  # replaced, not duplicated
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "correct horse" not in text and "a changed password" not in text
    assert sorted(read_credentials(path)) == ["resident", "teacher"]
    check = authenticator(path)
    assert check("teacher", "a changed password") and check("resident", "another passphrase")
    assert not check("teacher", "correct horse battery") and not check("nobody", "a changed password")
    assert not check("teacher", "")


def test_loose_permissions_short_passwords_and_bad_lines_are_refused(tmp_path):
    path = tmp_path / "credentials"
    assert add_user(path, "teacher", "correct horse battery").returncode == 0
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="mode 0644; others must not read it: chmod 600"):
        read_credentials(path)
    refused = add_user(path, "second", "long enough password")
    assert refused.returncode == 2 and "chmod 600" in refused.stderr
    os.chmod(path, 0o600)
    short = add_user(path, "second", "short")
    assert short.returncode == 2 and "at least 8 characters" in short.stderr
    path.write_text("teacher:plaintext-password\n")
    with pytest.raises(ValueError, match="line 1 is not 'name:scrypt"):
        read_credentials(path)
    with pytest.raises(ValueError, match="does not exist"):
        read_credentials(tmp_path / "missing")
