"""The systemd unit from scripts/install_service.sh: who it runs as, its sandbox as systemd-analyze scores it, its
timeouts and restart rules, and the READY=1 the app sends when it is really ready."""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from medgemma_xray.serving import exit_codes
from medgemma_xray.serving.settings import Settings
from tests.conftest import ISOLATED_VARIABLES, REPO_ROOT, free_port
from tests.scripts.harness import Operator

EXPOSURE_LIMIT = 3.0  # at most "OK" in systemd-analyze's words (below 1 it says "SAFE")


def analyzer() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is missing; scripts/setup_env.sh --dev installs systemd's tools")
    return found


def exposure(unit: Path) -> tuple[float, str]:
    result = subprocess.run([analyzer(), "security", "--offline=true", str(unit)], capture_output=True, text=True)
    match = re.search(rf"Overall exposure level for {re.escape(unit.name)}: ([0-9.]+) (\w+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    return float(match.group(1)), match.group(2)


def directives(unit: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if line and line[0] not in "#;[" and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


HIDDEN_FROM_THE_SERVICE = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")  # install_service.sh refuses these


@pytest.fixture()
def installable_checkout(portable_checkout: Path) -> Path:
    """The portable copy, if the unit can see it: it sits inside this checkout and reuses this checkout's .venv and
    models, so a clone under /home or /tmp (ProtectHome=, PrivateTmp=) cannot be installed as a service at all."""
    root = REPO_ROOT.resolve()
    hidden = next((p for p in HIDDEN_FROM_THE_SERVICE if root.is_relative_to(p)), None)
    if hidden is not None:
        pytest.skip(f"this checkout is under {hidden}, which the systemd unit hides; clone it elsewhere (e.g. /opt)")
    return portable_checkout


@pytest.fixture()
def service_user() -> str:
    """A name for the dedicated account the installer creates; the account is removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the installer creates the service's system user")
    name = f"mgx-{secrets.token_hex(3)}"
    yield name
    subprocess.run(["userdel", name], capture_output=True)


def install(installable_checkout: Path, log_dir: Path, *args: str) -> subprocess.CompletedProcess:
    op = Operator(log_dir, free_port(), scripts=installable_checkout / "scripts")
    return op.run("install_service.sh", *args, timeout=120)


def test_unit_runs_as_a_dedicated_user_owning_log_dir_and_scores_ok(installable_checkout, service_user, tmp_path):
    log_dir = installable_checkout / f"logs-{service_user}"
    unit = tmp_path / "medgemma-xray.service"
    no_env_file = tmp_path / "absent-env-file"
    result = install(
        installable_checkout,
        log_dir,
        "--user",
        service_user,
        "--output",
        str(unit),
        "--no-gpu",
        "--env-file",
        str(no_env_file),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"created system user {service_user}" in result.stdout

    account = pwd.getpwnam(service_user)
    assert account.pw_uid != 0 and account.pw_shell.endswith("nologin")
    owned = log_dir.stat()
    assert (owned.st_uid, owned.st_mode & 0o777) == (account.pw_uid, 0o700)
    assert (log_dir / "gradio_app.console.log").stat().st_uid == account.pw_uid

    unit_settings = directives(unit)
    expected = {
        "User": [service_user],
        "Type": ["notify"],
        "NotifyAccess": ["main"],
        "NoNewPrivileges": ["yes"],
        "ProtectSystem": ["strict"],
        "ReadWritePaths": [str(log_dir)],
        "ProtectHome": ["yes"],
        "PrivateTmp": ["yes"],
        "UMask": ["0077"],
        "CapabilityBoundingSet": [""],
        "Restart": ["on-failure"],
        "ExecStart": [f"{installable_checkout}/scripts/start_gradio.sh --foreground"],
        "ExecStop": [f"{installable_checkout}/scripts/stop_gradio.sh"],
        "EnvironmentFile": [f"-{no_env_file}"],
        "CacheDirectory": ["medgemma-xray"],
        "PrivateDevices": ["yes"],
        "IPAddressDeny": ["any"],
    }
    for key, value in expected.items():
        assert unit_settings.get(key) == value, (key, unit_settings.get(key))
    no_restart = unit_settings["RestartPreventExitStatus"][0].split()
    assert str(exit_codes.PORT_IN_USE) in no_restart and str(exit_codes.BAD_CONFIGURATION) in no_restart
    assert int(unit_settings["TimeoutStopSec"][0]) == Settings().drain_timeout_s + 30

    score, verdict = exposure(unit)
    print(f"\nsystemd-analyze security --offline=true: {score} {verdict}")
    assert score <= EXPOSURE_LIMIT and verdict in ("SAFE", "OK")
    verified = subprocess.run([analyzer(), "verify", str(unit)], capture_output=True, text=True)
    assert verified.returncode == 0 and str(unit) not in verified.stderr, verified.stderr

    gpu_unit = tmp_path / "gpu.service"
    result = install(installable_checkout, log_dir, "--user", service_user, "--output", str(gpu_unit), "--gpu")
    assert result.returncode == 0, result.stderr
    gpu_settings = directives(gpu_unit)
    assert gpu_settings["DevicePolicy"] == ["closed"] and "PrivateDevices" not in gpu_settings
    assert any(rule.startswith("char-nvidia") for rule in gpu_settings["DeviceAllow"])
    assert exposure(gpu_unit)[0] <= EXPOSURE_LIMIT


def test_the_score_check_can_fail(tmp_path):
    """The old unit's shape (root, no sandbox) must score far above the limit, or the check above proves nothing."""
    unit = tmp_path / "plain.service"
    unit.write_text("[Service]\nType=simple\nExecStart=/bin/true\n")
    score, verdict = exposure(unit)
    assert score > 9 and verdict == "UNSAFE"
    broken = tmp_path / "broken.service"
    broken.write_text("[Service]\nExecStart=/bin/true\nRestart=sometimes\n")
    complaint = subprocess.run([analyzer(), "verify", str(broken)], capture_output=True, text=True)
    assert "Failed to parse service restart specifier" in complaint.stderr


def test_unit_follows_the_environment_files_drain_timeout_and_host(installable_checkout, service_user, tmp_path):
    env_file = tmp_path / "medgemma-xray.env"
    env_file.write_text("# site settings\nDRAIN_TIMEOUT_S=300\nHOST='0.0.0.0'\n")
    unit = tmp_path / "site.service"
    log_dir = installable_checkout / f"logs-{service_user}"
    result = install(
        installable_checkout, log_dir, "--user", service_user, "--output", str(unit), "--env-file", str(env_file)
    )
    assert result.returncode == 0, result.stderr
    unit_settings = directives(unit)
    assert unit_settings["TimeoutStopSec"] == ["330"]
    assert "IPAddressDeny" not in unit_settings  # the ward's network must reach a server on 0.0.0.0


def test_installer_refuses_root_and_paths_the_sandbox_hides(installable_checkout, tmp_path):
    as_root = install(
        installable_checkout,
        installable_checkout / "logs-root",
        "--user",
        "root",
        "--output",
        str(tmp_path / "root.service"),
    )
    assert as_root.returncode == 1 and "refusing to run the service as root" in as_root.stderr
    in_tmp = install(
        installable_checkout, tmp_path / "logs", "--user", "nobody", "--output", str(tmp_path / "t.service")
    )
    assert in_tmp.returncode == 1 and "PrivateTmp=yes" in in_tmp.stderr
    assert not (tmp_path / "root.service").exists() and not (tmp_path / "t.service").exists()


def test_notify_sends_ready_only_once_listening_and_stopping_on_sigterm(demo_model_dir):
    folder = Path(tempfile.mkdtemp(prefix="notify-"))  # short: Unix socket paths are limited to 108 bytes
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    channel.bind(str(folder / "notify"))
    channel.settimeout(180)
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ISOLATED_VARIABLES}
    env.update({"LOG_DIR": str(folder / "logs"), "NOTIFY_SOCKET": str(folder / "notify")})
    server = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port), "--log_file", str(folder / "logs" / "app.log")],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        message = channel.recv(4096).decode()
        assert message.splitlines()[0] == "READY=1" and "STATUS=serving" in message
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as reply:
            assert reply.status == 200, "READY=1 came before the server could answer"
        server.send_signal(signal.SIGTERM)
        assert channel.recv(4096).decode().startswith("STOPPING=1")
        assert server.wait(timeout=60) == exit_codes.OK
    finally:
        server.kill()
        server.wait()
        channel.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_notify_reaches_an_abstract_socket_and_is_silent_outside_systemd(monkeypatch):
    from medgemma_xray.serving.systemd_notify import notify

    name = f"medgemma-test-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as channel:
        channel.bind("\0" + name)
        channel.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1", "STATUS=test") is True
        assert channel.recv(4096) == b"READY=1\nSTATUS=test"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert notify("READY=1") is False


def test_unit_limits_memory_and_open_files_from_the_settings(installable_checkout, service_user, tmp_path):
    """MemoryMax/MemoryHigh from MEMORY_MAX_MB, and LimitNOFILE above MAX_CONNECTIONS (systemd's default
    soft limit of 1,024 files let 1,100 idle connections starve every client)."""
    env_file = tmp_path / "medgemma-xray.env"
    env_file.write_text("MEMORY_MAX_MB=20000\nMAX_CONNECTIONS=100000\n")
    unit = tmp_path / "limits.service"
    log_dir = installable_checkout / f"logs-{service_user}"
    result = install(
        installable_checkout, log_dir, "--user", service_user, "--output", str(unit), "--env-file", str(env_file)
    )
    assert result.returncode == 0, result.stderr
    unit_settings = directives(unit)
    assert unit_settings["MemoryMax"] == ["20000M"] and unit_settings["MemoryHigh"] == ["18000M"]
    assert unit_settings["LimitNOFILE"] == ["104096"]
    env_file.write_text("")
    assert (
        install(
            installable_checkout, log_dir, "--user", service_user, "--output", str(unit), "--env-file", str(env_file)
        ).returncode
        == 0
    )
    unit_settings = directives(unit)
    assert "MemoryMax" not in unit_settings and unit_settings["LimitNOFILE"] == ["65536"]
