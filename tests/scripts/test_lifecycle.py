"""Start, stop and status as real processes: races, taken ports, whose process a PID is, and what status says."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize
from medgemma_xray.serving import exit_codes
from tests.conftest import REPO_ROOT, free_port
from tests.scripts.harness import Operator, make_paced_checkout

pytestmark = pytest.mark.slow
MODEL_LOADED = "PyTorch backend ready in"  # medgemma_xray.serving.service logs this once per model load


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_three_concurrent_starts_give_one_visible_server_and_one_model_load(tmp_path):
    op = Operator(tmp_path / "logs", free_port())
    try:
        starts = [op.popen("start_gradio.sh") for _ in range(3)]
        results = [(start.wait(timeout=300), *start.communicate()) for start in starts]
        winners = [out for code, out, _ in results if code == 0]
        losers = [err for code, _, err in results if code == 1]
        assert len(winners) == 1 and len(losers) == 2, results
        assert "ready: " in winners[0]
        for err in losers:
            assert "another start is under way" in err or "already running (PID" in err, err

        pid = op.pid()
        assert op.servers() == [pid], "exactly one server process, and it is the one in the PID file"
        status = op.status_json()
        assert status["running"] is True and status["state"] == "running" and status["pid"] == pid
        log = (op.log_dir / "gradio_app.log").read_text()
        assert log.count(MODEL_LOADED) == 1, log

        stopped = op.run("stop_gradio.sh")
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        assert op.servers() == [] and not alive(pid)
        assert op.run("status_gradio.sh").returncode == 3
    finally:
        op.cleanup()


def test_taken_port_fails_before_the_model_loads_with_the_no_restart_code(tmp_path):
    holder = socket.socket()  # any other program's listener
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    op = Operator(tmp_path / "logs", port)
    try:
        for args in ((), ("--foreground",)):
            started = op.run("start_gradio.sh", *args, timeout=120)
            assert started.returncode == exit_codes.PORT_IN_USE, (args, started.stdout, started.stderr)
            assert "ready" not in started.stdout
            assert f"127.0.0.1:{port} is already in use" in started.stderr + started.stdout
            log = (op.log_dir / "gradio_app.log").read_text()
            assert "cannot listen" in log and MODEL_LOADED not in log, "the model must not load on a taken port"
            assert not op.pid_file.exists() or args == ("--foreground",)
            assert op.servers() == []
        # The unit's RestartPreventExitStatus= lists this code (tests/scripts/test_systemd_unit.py checks the unit).
        assert exit_codes.PORT_IN_USE in exit_codes.NO_RESTART
    finally:
        holder.close()
        op.cleanup()


def test_start_on_a_port_another_instance_holds_never_prints_ready(tmp_path, demo_server):
    port = int(demo_server.url.rsplit(":", 1)[1])
    op = Operator(tmp_path / "logs", port)
    try:
        started = op.run("start_gradio.sh", timeout=120)
        assert started.returncode == exit_codes.PORT_IN_USE, started.stdout + started.stderr
        assert "ready" not in started.stdout
        assert op.servers() == [] and not op.pid_file.exists()
    finally:
        op.cleanup()


def test_readiness_probe_accepts_only_its_own_instance(demo_server):
    """The start script's readiness check, against a real server: another instance's "ready" is not ours."""
    with urllib.request.urlopen(f"{demo_server.url}/readyz", timeout=5) as reply:
        instance = json.loads(reply.read())["instance"]
    assert len(instance) >= 16

    def probe(expected: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "medgemma_xray.serving.readiness", "--url", demo_server.url, "--instance", expected],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )

    assert probe(instance).returncode == 0
    other = probe("0123456789abcdef")
    assert other.returncode == 2 and f"instance {instance}" in other.stdout
    nobody = subprocess.run(
        [
            sys.executable,
            "-m",
            "medgemma_xray.serving.readiness",
            "--url",
            f"http://127.0.0.1:{free_port()}",
            "--instance",
            "x",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert nobody.returncode == 1


def test_pid_check_matches_this_checkouts_app_py_only(tmp_path):
    """A PID file naming another project's app.py is stale: status says so and stop leaves that process alone."""
    other_project = tmp_path / "other-project"
    other_project.mkdir()
    (other_project / "app.py").write_text("import time\ntime.sleep(300)\n")
    decoy = subprocess.Popen([sys.executable, str(other_project / "app.py")])
    op = Operator(tmp_path / "logs", free_port())
    try:
        op.log_dir.mkdir(parents=True)
        op.pid_file.write_text(f"{decoy.pid}\n")
        status = op.run("status_gradio.sh", "--json")
        assert status.returncode == 1, status.stdout + status.stderr
        assert json.loads(status.stdout)["state"] == "dead"
        stopped = op.run("stop_gradio.sh")
        assert stopped.returncode == 0 and "removed a stale PID file" in stopped.stdout
        time.sleep(0.5)
        assert decoy.poll() is None, "stop signalled a process that is not this checkout's server"
        assert not op.pid_file.exists()
    finally:
        decoy.kill()
        decoy.wait()


def test_status_during_start_up_and_with_the_control_channel_gone_says_starting_in_json(tmp_path):
    op = Operator(tmp_path / "logs", free_port())
    samples = []
    try:
        start = op.popen("start_gradio.sh")
        while start.poll() is None:
            result = op.run("status_gradio.sh", "--json")
            samples.append((result.returncode, json.loads(result.stdout)))  # always JSON, or this raises
        assert start.returncode == 0, start.communicate()
        starting = [body for code, body in samples if code == 150]
        assert starting, f"never saw 'starting' during start-up: {samples}"
        assert all(body["state"] == "starting" and body["running"] is True for body in starting)
        assert all(code in (0, 3, 150) for code, _ in samples), samples
        assert samples[-1][0] in (0, 150)

        socket_path = op.log_dir / "control.sock"
        socket_path.rename(socket_path.with_name("moved.sock"))  # the process lives; its channel is unreachable
        result = op.run("status_gradio.sh", "--json")
        assert result.returncode == 150, result.stdout + result.stderr
        body = json.loads(result.stdout)
        assert body["state"] == "starting" and body["pid"] == op.pid() and "does not answer" in body["detail"]
        text = op.run("status_gradio.sh")
        assert text.returncode == 150 and text.stdout.startswith("Status: starting")
        socket_path.with_name("moved.sock").rename(socket_path)
        assert op.run("status_gradio.sh").returncode == 0
    finally:
        op.cleanup()


def test_stale_pid_file_socket_and_token_are_removed(tmp_path):
    op = Operator(tmp_path / "logs", free_port())
    leftovers = [op.pid_file, op.log_dir / "control.sock", op.log_dir / "control.token"]
    try:
        assert op.run("start_gradio.sh").returncode == 0
        pid = op.pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(path.exists() for path in leftovers), "kill -9 leaves the PID file, socket and token"
        status = op.run("status_gradio.sh", "--json")
        assert status.returncode == 1 and json.loads(status.stdout)["state"] == "dead"
        stopped = op.run("stop_gradio.sh")
        assert stopped.returncode == 0 and "removed a stale PID file, control socket and token" in stopped.stdout
        assert [path for path in leftovers if path.exists()] == []
        assert op.run("status_gradio.sh").returncode == 3
    finally:
        op.cleanup()


def test_one_drain_timeout_setting_is_read_by_the_app_and_the_stop_script(tmp_path, random_model_dir):
    def setting(**env: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "medgemma_xray.serving.settings", "get", "drain_timeout_s"],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    from medgemma_xray.serving.settings import Settings

    assert setting() == str(Settings().drain_timeout_s)
    assert float(setting(DRAIN_TIMEOUT_S="4")) == 4

    film = tmp_path / "film.dcm"
    film.write_bytes(dicom_bytes(quantize(chest_phantom(seed=3), 12), bits_stored=12, window=(2048, 4096)))
    # The random-weight model never stops early, and each step is paced to at least 50 ms: the answer runs for
    # minutes on any machine, far longer than the 4 s drain (unpaced, a fast idle machine finished it inside it).
    op = Operator(
        tmp_path / "logs",
        free_port(),
        scripts=make_paced_checkout(tmp_path / "checkout"),
        DRAIN_TIMEOUT_S="4",
        MAX_NEW_TOKENS="2048",
        TEST_DECODE_PACE_S="0.05",
        MODEL_PATH=str(random_model_dir),
    )
    answer: dict = {}

    def ask() -> None:
        client = Client(op.url, verbose=False)
        client.predict(handle_file(str(film)), api_name="/upload_film")
        try:
            answer["chat"] = client.predict("Findings?", api_name="/ask")
        except Exception as exc:  # the drain cuts it: what the user sees is checked below
            answer["error"] = repr(exc)

    try:
        assert op.run("start_gradio.sh").returncode == 0
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        deadline = time.monotonic() + 60
        while op.status_json()["requests_running"] == 0:
            assert time.monotonic() < deadline, "the answer never started"
            time.sleep(0.2)
        began = time.monotonic()
        stopped = op.run("stop_gradio.sh", timeout=120)
        took = time.monotonic() - began
        assert stopped.returncode == 0, stopped.stderr
        # the stop script read the same setting: the drain, and SIGKILL only 15 s after it
        assert "running answers get up to 4 s to finish; SIGKILL after 19 s" in stopped.stdout, stopped.stdout
        # No SIGKILL is the upper bound: the script sends it 19 s after SIGTERM. Its own wall time also counts its
        # start-up before SIGTERM (reading the setting through Python), so it is no bound: 19.3 s on a loaded
        # 2-core machine (2026-12-02) while the server stopped 12.7 s after SIGTERM.
        assert "sending SIGKILL" not in stopped.stdout
        assert took > 3.5, took  # it waited for the drain
        log = (op.log_dir / "gradio_app.log").read_text()
        assert "answers still running after 4 s; stopping anyway" in log and "stopped" in log
    finally:
        op.cleanup()


def test_another_users_server_is_alive_not_dead(portable_checkout):
    """kill -0 fails with EPERM for another user's process: that is not "dead", and stop must not claim it."""
    # LOG_DIR where the second user may read the PID file, as an operator on the same host can
    op = Operator(portable_checkout / "logs", free_port(), scripts=portable_checkout / "scripts")
    try:
        started = op.run("start_gradio.sh")  # as root
        assert started.returncode == 0, started.stdout + started.stderr
        pid = op.pid()
        op.log_dir.chmod(0o755)
        op.pid_file.chmod(0o644)  # the start writes it 0600; this operator was given read access
        status = op.run("status_gradio.sh", "--json", user="nobody")
        assert status.returncode == 4, status.stdout + status.stderr
        body = json.loads(status.stdout)
        assert body["running"] is True and body["pid"] == pid and body["state"] == "unknown"
        stopped = op.run("stop_gradio.sh", user="nobody")
        assert stopped.returncode == 4 and "not allowed to signal PID" in stopped.stderr, stopped.stdout
        assert alive(pid) and op.pid_file.exists()
        assert op.run("status_gradio.sh").returncode == 0  # root still sees it running
    finally:
        op.cleanup()
