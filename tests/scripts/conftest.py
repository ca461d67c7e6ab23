"""Fixtures for the operator-script tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.scripts.harness import make_portable_checkout


@pytest.fixture(scope="session")
def portable_checkout() -> Iterator[Path]:
    """This working tree copied where any user may run it (for tests that need a second, unprivileged user).
    Under REPO_ROOT/test-artifacts, not /tmp: the systemd unit refuses paths that PrivateTmp= would hide."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test runs the server and an operator or the service as different users")
    (REPO_ROOT / "test-artifacts").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="portable-", dir=REPO_ROOT / "test-artifacts"))
    folder.chmod(0o755)
    try:
        checkout = make_portable_checkout(folder / "checkout")
    except RuntimeError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(str(exc))
    yield checkout
    shutil.rmtree(folder, ignore_errors=True)
