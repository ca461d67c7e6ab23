"""The typed settings registry: read once from the environment, validated with messages that name the variable,
and the CLI the shell scripts read values through."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from medgemma_xray.inference_api.types import Mode
from medgemma_xray.serving.settings import Settings, SettingsError
from tests.conftest import ISOLATED_VARIABLES, REPO_ROOT


def test_environment_values_are_typed_and_overrides_win():
    settings = Settings.from_env(
        {"INFERENCE_MODE": "TRT", "PORT": "8123", "KEEP_BOTH_BACKENDS": "yes", "DRAIN_TIMEOUT_S": "45.5"}, port=9000
    )
    assert settings.inference_mode is Mode.TRT and settings.port == 9000
    assert settings.keep_both_backends is True and settings.drain_timeout_s == 45.5
    assert settings.kv_slots == settings.generation_concurrency + settings.max_resident_conversations


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"INFERENCE_MODE": "onnx"}, "valid modes: pytorch, trt"),
        ({"PORT": "seventy"}, "PORT='seventy' is not a valid int"),
        ({"PORT": "70000"}, "PORT must be in 1..65535"),
        ({"KEEP_BOTH_BACKENDS": "maybe"}, "KEEP_BOTH_BACKENDS='maybe'"),
        ({"TORCH_PATH": "turbo"}, "TORCH_PATH must be one of auto, eager, fast"),
        ({"GENERATION_CONCURRENCY": "0"}, "GENERATION_CONCURRENCY must be in 1..256"),
    ],
)
def test_bad_values_name_the_variable_and_what_is_valid(environ, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        Settings.from_env(environ)


def test_the_cli_prints_what_the_environment_makes_of_a_setting():
    environment = {"PATH": "/usr/bin:/bin", "DRAIN_TIMEOUT_S": "33"}
    command = [sys.executable, "-m", "medgemma_xray.serving.settings"]
    got = subprocess.run(
        [*command, "get", "drain_timeout_s"], cwd=REPO_ROOT, env=environment, capture_output=True, text=True
    )
    assert got.returncode == 0 and got.stdout.strip() == "33.0"
    shown = json.loads(
        subprocess.run([*command, "show"], cwd=REPO_ROOT, env=environment, capture_output=True, text=True).stdout
    )
    assert shown["inference_mode"] == "pytorch" and shown["drain_timeout_s"] == 33.0
    bad = subprocess.run(
        [*command, "get", "port"], cwd=REPO_ROOT, env={**environment, "PORT": "x"}, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "PORT='x'" in bad.stderr
    assert "DRAIN_TIMEOUT_S" in ISOLATED_VARIABLES  # test servers never inherit a developer's value
