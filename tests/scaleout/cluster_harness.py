"""A Ray cluster started as the operator docs say (`medgemma-xray-ray start CONFIG`: real `ray start` and `serve
deploy` processes), on free ports, with its own HOME (so its own token) and Ray folder; stopped by signalling
exactly the processes of its session."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from tests.conftest import REPO_ROOT, free_port

STOP_GRACE_S = 3  # SIGTERM to SIGKILL in RayCluster.stop


def host_addresses() -> list[str]:
    """This host's IPv4 addresses other than loopback (from `ip -4 addr`)."""
    if shutil.which("ip") is None:
        return []
    listing = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False).stdout
    found = re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", listing)
    return [address for address in found if not ipaddress.ip_address(address).is_loopback]


def _hex_address(text: str) -> str:
    """/proc/net/tcp{,6}'s little-endian hex address as text."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)  # a v4-mapped address as the IPv4 address it is


def listening_sockets() -> dict[str, tuple[str, int]]:
    """socket inode -> (address, port) of every TCP socket in LISTEN on this host."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                columns = row.split()
                if columns[3] == "0A":
                    address, port = columns[1].rsplit(":", 1)
                    found[columns[9]] = (_hex_address(address), int(port, 16))
    return found


class RayCluster:
    def __init__(
        self,
        folder: Path,
        model_dir: Path | None,
        replicas: int = 1,
        extra_args: dict | None = None,
        launcher_args: tuple[str, ...] = (),
    ) -> None:
        self.folder = folder
        self.home = folder / "home"
        self.home.mkdir()
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.ingress_port, self.proxy_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.ingress_port}"
        env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "MODEL_PATH"))}
        env.update(HOME=str(self.home), LOG_DIR=str(folder / "logs"), PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
        self.env = env
        self.log = folder / "launcher.log"
        self.ray_folder = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must stay short
        command = [
            sys.executable,
            "-m",
            "medgemma_xray.scaleout.cluster",
            "start",
            f"--port={self.gcs_port}",
            f"--dashboard-port={self.dashboard_port}",
            f"--temp-dir={self.ray_folder}",
            f"--ray-args=--num-cpus 2 --ray-client-server-port {free_port()}",
            *launcher_args,
        ]
        if model_dir is not None:
            config = yaml.safe_load((REPO_ROOT / "deploy/ray/medgemma-cpu-demo.yaml").read_text())
            config["http_options"]["port"] = self.proxy_port
            config["applications"][0]["args"].update(
                replicas=replicas, model_path=str(model_dir), port=self.ingress_port, **(extra_args or {})
            )
            (folder / "serve.yaml").write_text(yaml.safe_dump(config))
            command.append(str(folder / "serve.yaml"))
        with open(self.log, "ab") as out:
            # a session of its own: every Ray process started here (daemons and actors) stays in it, and stop()
            # signals exactly those
            self.launcher = subprocess.Popen(
                command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.session = self.launcher.pid
        if self.launcher.wait(timeout=600) != 0:
            raise RuntimeError(f"the launcher failed:\n{self.log.read_text()[-4000:]}")

    @property
    def token_file(self) -> Path:
        return self.home / ".ray" / "auth_token"

    def processes(self) -> list[int]:
        """The ids of this cluster's live processes: those in the launcher's session (zombies left out)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z" and os.getsid(int(entry.name)) == self.session:
                        found.append(int(entry.name))
        return found

    def listening(self) -> list[tuple[str, int, str]]:
        """(address, port, process name) of every TCP socket the cluster's processes listen on."""
        sockets = listening_sockets()
        found = []
        for pid in self.processes():
            with contextlib.suppress(OSError):
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                for fd in Path(f"/proc/{pid}/fd").iterdir():
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inode = target[len("socket:[") : -1]
                        if inode in sockets:
                            found.append((*sockets[inode], name))
        return found

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{self.url}/readyz", timeout=5).json().get("ready"):
                    return
            time.sleep(2)
        raise TimeoutError(f"the ingress was not ready; Ray's logs are in {self.ray_folder}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE_S, to each process of this cluster's session, by its id. The grace
        is short because nothing is read from a cluster once a test stops it, and Ray's GCS server and autoscaler
        monitor do not end on SIGTERM: every stop waited out the whole grace (15 s, then SIGKILL). Measured on a
        bare head (RayCluster(folder, None)), 2026-12-03, this 2-core host: the dashboard's processes and the
        DashboardAgent ended within 0.5 s of SIGTERM, the raylet and the RuntimeEnvAgent after about 10 s, the GCS
        server and ray/autoscaler/_private/monitor.py were still running 16 s on."""
        for signal_number, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 15)):
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal_number)
            deadline = time.monotonic() + wait_s
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(self.ray_folder, ignore_errors=True)
