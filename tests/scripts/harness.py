"""Running the operator scripts as an operator does, and finding the server processes they leave behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.conftest import ISOLATED_VARIABLES, REPO_ROOT


class Operator:
    """Runs the scripts the way an operator does, against one install's LOG_DIR and port."""

    def __init__(self, log_dir: Path, port: int, scripts: Path = REPO_ROOT / "scripts", **env: str) -> None:
        self.log_dir, self.port, self.scripts = log_dir, port, scripts
        self.env = {key: value for key, value in os.environ.items() if key not in ISOLATED_VARIABLES}
        self.env.update({"LOG_DIR": str(log_dir), "PORT": str(port), **env})

    def command(self, script: str, *args: str, user: str | None = None) -> list[str]:
        command = [str(self.scripts / script), *args]
        if user is not None:  # runuser -u keeps the environment we pass (LOG_DIR, PORT), resets HOME and USER
            command = ["runuser", "-u", user, "--", *command]
        return command

    def run(self, script: str, *args: str, timeout: int = 300, user: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(script, *args, user=user),
            cwd="/",  # the scripts must work from any working directory
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, script: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(script, *args),
            cwd="/",
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @property
    def pid_file(self) -> Path:
        return self.log_dir / "gradio_app.pid"

    def pid(self) -> int:
        return int(self.pid_file.read_text())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status_json(self, user: str | None = None) -> dict:
        result = self.run("status_gradio.sh", "--json", user=user)
        return json.loads(result.stdout)

    def servers(self) -> list[int]:
        """Every live app.py process started for this LOG_DIR, whoever started it."""
        return servers_for(self.log_dir)

    def cleanup(self) -> None:
        if self.pid_file.exists():
            self.run("stop_gradio.sh", "--timeout", "20")
        for pid in self.servers():  # whatever a failed test left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def servers_for(log_dir: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith(b"app.py") and f"LOG_DIR={log_dir}".encode() in environ:
            found.append(int(entry.name))
    return sorted(found)


def make_portable_checkout(target: Path) -> Path:
    """A copy of this working tree that any user may run: world-readable, with a .venv on the system Python that
    reuses the project venv's packages and imports the copy's own src/ (.pth). The project's own .venv may sit on an interpreter that only its
    owner can reach (pyenv under /root), which no service user or second operator could run."""
    system_python = Path("/usr/bin/python3")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not system_python.exists():
        raise RuntimeError("no /usr/bin/python3 to build a venv any user can run")
    probe = subprocess.run(
        [str(system_python), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    )
    if probe.stdout.strip() != str(tuple(sys.version_info[:2])):
        raise RuntimeError(f"/usr/bin/python3 is {probe.stdout.strip()}, the project venv {version}")
    ignore = shutil.ignore_patterns(".git", ".venv", "models", "logs", "test-artifacts", "__pycache__", ".*_cache")
    shutil.copytree(REPO_ROOT, target, ignore=ignore, symlinks=True)
    (target / "models").symlink_to((REPO_ROOT / "models").resolve())
    subprocess.run([str(system_python), "-m", "venv", "--without-pip", str(target / ".venv")], check=True)
    site = target / ".venv" / "lib" / version / "site-packages"
    # The copy's own src/ (as the editable install does for the project venv, whose .pth files a path entry does
    # not run), then the project venv's packages.
    (site / "project-venv.pth").write_text(f"{target / 'src'}\n{sysconfig.get_paths()['purelib']}\n")
    for path in [target, *target.parents]:
        if path == Path("/"):
            break
        if path.stat().st_mode & 0o005 != 0o005:
            raise RuntimeError(f"{path} is not readable by other users; the copy must be")
    subprocess.run(["chmod", "-R", "o+rX", str(target)], check=True)
    return target


def make_paced_checkout(target: Path) -> Path:
    """A checkout whose app.py is tests/support/paced_server.py (each decode step takes at least
    TEST_DECODE_PACE_S), so a test of a time limit gets an answer whose length in seconds does not depend on the
    machine: the operator scripts start `app.py` of their own checkout. Scripts copied (lib.sh finds the checkout by
    their real path), the venv linked. Returns the copy's scripts folder."""
    shutil.copytree(REPO_ROOT / "scripts", target / "scripts")
    (target / ".venv").symlink_to(REPO_ROOT / ".venv")
    paced = REPO_ROOT / "tests" / "support" / "paced_server.py"
    (target / "app.py").write_text(f"import runpy\n\nrunpy.run_path({str(paced)!r}, run_name='__main__')\n")
    return target / "scripts"
