"""The documented Ray setup (`medgemma-xray-ray start`, real `ray start` and `serve deploy`) against a client
without the token on this host's network address, and the Ray ingress against 1,200 half-open connections.

- Loopback (the default): no Ray port answers on the host's address, except Serve's replica-to-replica gRPC, which
  Ray Serve 2.60 binds to every interface itself: it refuses a call without the token. The dashboard's job API is
  not reachable there. Over loopback, a client without the token is refused, and with it the same client runs a
  task (so the refusal is the token's doing, not a broken cluster).
- --allow-network: the GCS listens on the host's address; a client there without the token is refused, with it
  runs a task; the dashboard stays on loopback.
- The ingress is the project's guarded listener: 1,200 connections that never finish their request head are each
  closed within HEADER_TIMEOUT_S (plus scheduling slack), while /healthz and another client's request answer.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.scaleout.cluster_harness import RayCluster, host_addresses

pytestmark = pytest.mark.slow

HEADER_TIMEOUT_S = 5
HALF_OPEN = 1200
SLACK_S = 25  # a loaded 2-core machine may run the ingress's timers late; generous, not a speed claim
PROBE = str(Path(__file__).with_name("ray_client_probe.py"))


def network_address() -> str:
    addresses = host_addresses()
    if not addresses:
        pytest.skip("this host has no IPv4 address other than loopback: no network client can be simulated")
    return addresses[0]


def probe(address: str, env: dict) -> str:
    """ray_client_probe.py in its own process, with exactly `env`; its one line."""
    result = subprocess.run(
        [sys.executable, PROBE, address], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith(("RAN", "REFUSED"))]
    assert lines, result.stdout[-2000:] + result.stderr[-2000:]
    return lines[-1]


def intruder_env(tmp_path: Path, **extra: str) -> dict:
    """A client's environment with no Ray token anywhere (its own empty HOME, no RAY_AUTH_*)."""
    home = tmp_path / "intruder"
    home.mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", **extra)
    return env


def reachable(source: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(5)
        sock.bind((source, 0))
        try:
            sock.connect((source, port))
        except OSError:
            return False
        return True


def unauthenticated_serve_call(address: str, port: int) -> str:
    """A call to Serve's replica gRPC service without the token: the status code's name."""
    import grpc

    with grpc.insecure_channel(f"{address}:{port}") as channel:
        call = channel.unary_unary(
            "/ray.serve.ASGIService/HandleRequest",
            request_serializer=lambda payload: payload,
            response_deserializer=lambda payload: payload,
        )
        try:
            call(b"", timeout=10)
        except grpc.RpcError as exc:
            return exc.code().name
    return "ANSWERED"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, demo_model_dir):
    folder = tmp_path_factory.mktemp("ray-secure")
    cluster = RayCluster(folder, demo_model_dir, replicas=1, extra_args={"header_timeout_s": HEADER_TIMEOUT_S})
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


def test_a_client_without_the_token_on_the_hosts_address_cannot_connect_or_submit_work(cluster, tmp_path):
    address = network_address()
    token = cluster.token_file
    assert token.exists() and token.stat().st_mode & 0o077 == 0, "the token is private to its user"

    listening = cluster.listening()
    ports = {port for _, port, _ in listening}
    assert {cluster.gcs_port, cluster.dashboard_port, cluster.ingress_port} <= ports, listening
    on_network = [(ip, port, name) for ip, port, name in listening if not ipaddress.ip_address(ip).is_loopback]
    for ip, port, name in on_network:  # only Serve's replica gRPC binds every interface (Ray's own choice)
        assert name.startswith("ray::ServeRepli"), f"{name} listens on {ip}:{port}"
        assert reachable(address, port)
        assert unauthenticated_serve_call(address, port) == "UNAUTHENTICATED", (name, port)
    for port in ports - {port for _, port, _ in on_network}:
        assert not reachable(address, port), f"port {port} answers on {address}"

    with pytest.raises(httpx.ConnectError):  # Ray's job API: the dashboard is on loopback only
        httpx.post(f"http://{address}:{cluster.dashboard_port}/api/jobs/", json={"entrypoint": "id"}, timeout=10)
    refused = httpx.post(f"http://127.0.0.1:{cluster.dashboard_port}/api/jobs/", json={"entrypoint": "id"}, timeout=10)
    assert refused.status_code == 401, refused.text  # and there it wants the token

    single_host = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    loopback_gcs = f"127.0.0.1:{cluster.gcs_port}"
    assert probe(loopback_gcs, intruder_env(tmp_path, **single_host)).startswith("REFUSED")
    with_token = intruder_env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), **single_host)
    assert probe(loopback_gcs, with_token).startswith("RAN"), "the same client with the token runs a task"


def test_the_ingress_closes_1200_half_open_connections_within_the_header_timeout(cluster):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HALF_OPEN + 256:
        pytest.skip(f"this process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
    half_open: list[tuple[socket.socket, float]] = []
    try:
        for _ in range(HALF_OPEN):
            sock = socket.create_connection(("127.0.0.1", cluster.ingress_port), timeout=30)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            half_open.append((sock, time.monotonic()))
        # meanwhile the probes and another client are answered
        assert httpx.get(f"{cluster.url}/healthz", timeout=30).status_code == 200
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30)
        assert other.get(f"{cluster.url}/v1/models").status_code == 200

        late: list[float] = []
        lock = threading.Lock()

        def await_close(sock: socket.socket, opened: float) -> None:
            sock.settimeout(HEADER_TIMEOUT_S + SLACK_S)
            open_for = float("inf")  # still open when the wait ran out
            with contextlib.suppress(TimeoutError):
                try:
                    while sock.recv(4096):
                        pass
                except ConnectionResetError:
                    pass
                open_for = time.monotonic() - opened
            with lock:
                late.append(open_for)

        threads = [threading.Thread(target=await_close, args=pair) for pair in half_open]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(late) == HALF_OPEN
        slowest = max(late)
        assert slowest < HEADER_TIMEOUT_S + SLACK_S, f"a half-open connection was open {slowest:.1f} s"
        print(f"{HALF_OPEN} half-open connections: each closed within {slowest:.1f} s of opening")
    finally:
        for sock, _ in half_open:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_with_allow_network_the_gcs_is_on_the_network_and_still_wants_the_token(tmp_path_factory, tmp_path):
    address = network_address()
    folder = tmp_path_factory.mktemp("ray-network")
    cluster = RayCluster(folder, None, launcher_args=("--allow-network", f"--node-ip={address}"))
    try:
        gcs = f"{address}:{cluster.gcs_port}"
        assert reachable(address, cluster.gcs_port), "the operator asked for the network"
        assert not reachable(address, cluster.dashboard_port), "the dashboard stays on loopback"
        assert probe(gcs, intruder_env(tmp_path)).startswith("REFUSED")
        with_token = intruder_env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(cluster.token_file))
        assert probe(gcs, with_token).startswith("RAN")
    finally:
        cluster.stop()


def test_the_launcher_refuses_a_shared_token_and_a_network_address_without_allow_network(tmp_path):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    token = home / ".ray" / "auth_token"
    token.write_text("0123456789abcdef")
    token.chmod(0o644)
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env["HOME"] = str(home)
    launcher = [sys.executable, "-m", "medgemma_xray.scaleout.cluster"]
    shared = subprocess.run([*launcher, "start"], env=env, capture_output=True, text=True, timeout=120)
    assert shared.returncode == 2 and "chmod 600" in shared.stderr, shared.stderr
    token.unlink()
    token.symlink_to(tmp_path / "elsewhere")
    linked = subprocess.run([*launcher, "start"], env=env, capture_output=True, text=True, timeout=120)
    assert linked.returncode == 2 and "symlink" in linked.stderr, linked.stderr
    token.unlink()
    network = subprocess.run(
        [*launcher, "start", "--node-ip=10.1.2.3"], env=env, capture_output=True, text=True, timeout=120
    )
    assert network.returncode == 2 and "--allow-network" in network.stderr, network.stderr
    disabled = subprocess.run(
        [*launcher, "start"], env={**env, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True, timeout=120
    )
    assert disabled.returncode == 2 and "token authentication" in disabled.stderr, disabled.stderr
