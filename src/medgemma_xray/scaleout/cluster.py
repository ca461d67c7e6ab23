"""Start and stop the Ray cluster for the scale-out, with token authentication always on and, by default, every
Ray port on loopback.

    medgemma-xray-ray start deploy/ray/medgemma-gpu.yaml      # a one-host cluster: Ray on 127.0.0.1, the app deployed
    medgemma-xray-ray run -- serve status                     # any Ray command, with this cluster's token
    medgemma-xray-ray stop
    medgemma-xray-ray start --allow-network --node-ip 10.0.0.5 CONFIG   # a head that other hosts join (token on)
    medgemma-xray-ray join --allow-network --node-ip 10.0.0.6 10.0.0.5:6379   # on each other host

Why: `ray start --head` on its own opens the GCS, the raylet, the workers and the Ray client server on every
interface, and (Ray 2.60) without authentication: anyone who reaches them runs code as the user that runs Ray.
Here:
- the token (RAY_AUTH_MODE=token) is always on. It lives in RAY_AUTH_TOKEN_PATH, else Ray's ~/.ray/auth_token,
  created 0600 in a 0700 folder if missing; a token file others may read, or a symlink, is refused (exit 2);
- without --allow-network, Ray runs as a single-host cluster (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray's own
  single-host mode, which binds every port to 127.0.0.1; `--node-ip-address 127.0.0.1` alone is replaced by the
  host's address by `ray start`);
- with --allow-network (or ALLOW_RAY_NETWORK=1) the GCS and the nodes listen on the address the operator names,
  still with the token; the dashboard stays on 127.0.0.1 unless --dashboard-host names another address.
The application's HTTP door is not Ray's: the ingress serves the pages and the API from the project's own guarded
listener (serve_app.Ingress), and Serve's proxy listens on 127.0.0.1 only.

Exit status: 0 done, 1 a Ray command failed, 2 bad usage or configuration (do not retry).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import stat
import subprocess
import sys
from pathlib import Path

LOOPBACK = "127.0.0.1"
DEFAULT_GCS_PORT = 6379
DEFAULT_DASHBOARD_PORT = 8265
INGRESS_RESOURCE = "medgemma_ingress"  # the head has it; the configs' ingress_resource pins the ingress there


class ClusterConfigError(RuntimeError):
    """A configuration the launcher refuses; the message says what to change."""


def network_allowed(environ: dict[str, str]) -> bool:
    """ALLOW_RAY_NETWORK=1 (or true, yes, on): the operator asks for Ray on the network."""
    return environ.get("ALLOW_RAY_NETWORK", "").lower() in ("1", "true", "yes", "on")


def token_path(environ: dict[str, str]) -> Path:
    """Where Ray reads the token: RAY_AUTH_TOKEN_PATH, else Ray's default ~/.ray/auth_token."""
    explicit = environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(explicit) if explicit else Path(environ.get("HOME", str(Path.home()))) / ".ray" / "auth_token"


def ensure_token(path: Path, create: bool = True) -> Path:
    """The token file, created (0600, folder 0700) when missing and `create`. Refuses a symlink, a file that is not
    regular or that others may read or write, and an empty one: whoever reads the token controls the cluster."""
    if path.is_symlink():
        raise ClusterConfigError(f"the Ray token {path} is a symlink; replace it with a regular file (mode 0600)")
    if not path.exists():
        if not create:
            raise ClusterConfigError(
                f"no Ray token at {path}: copy the head's token there (mode 0600) or set RAY_AUTH_TOKEN_PATH"
            )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_hex(32))
        return path
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise ClusterConfigError(f"the Ray token {path} is not a regular file")
    if info.st_mode & 0o077:
        raise ClusterConfigError(
            f"the Ray token {path} has mode {stat.S_IMODE(info.st_mode):04o}; others must not read it: chmod 600 {path}"
        )
    if not path.read_text().strip():
        raise ClusterConfigError(f"the Ray token {path} is empty; delete it to have a new one made")
    return path


def ray_environment(environ: dict[str, str], allow_network: bool, create_token: bool = True) -> dict[str, str]:
    """The environment every Ray command of this cluster runs with (ray start, serve deploy, ray.init)."""
    if environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        raise ClusterConfigError(
            f"RAY_AUTH_MODE={environ['RAY_AUTH_MODE']}: this cluster runs only with Ray's token authentication; "
            "unset RAY_AUTH_MODE"
        )
    env = dict(environ)
    env["RAY_AUTH_MODE"] = "token"
    if not env.get("RAY_AUTH_TOKEN"):
        env["RAY_AUTH_TOKEN_PATH"] = str(ensure_token(token_path(environ), create=create_token))
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no telemetry leaves the site
    if not allow_network:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's single-host mode: every port on loopback
    else:
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    return env


def head_command(args: argparse.Namespace) -> list[str]:
    node_ip = args.node_ip if args.allow_network else LOOPBACK
    dashboard_host = args.dashboard_host or LOOPBACK
    command = [
        *_ray_tool("ray"),
        "start",
        "--head",
        f"--port={args.port}",
        f"--node-ip-address={node_ip}",
        f"--dashboard-host={dashboard_host}",
        f"--dashboard-port={args.dashboard_port}",
        "--disable-usage-stats",
    ]
    if args.temp_dir:
        command.append(f"--temp-dir={args.temp_dir}")
    if not any(part.startswith("--resources") for part in args.ray_args):
        command.append(f'--resources={{"{INGRESS_RESOURCE}": 1}}')
    return command + list(args.ray_args)


RAY_TOOLS = {"ray": "ray.scripts.scripts", "serve": "ray.serve.scripts"}


def _ray_tool(name: str) -> list[str]:
    """Ray's command line run by this very Python: Ray starts its workers with the interpreter that ran `ray
    start`, so they import this installation of the project, whatever the console scripts' shebangs say."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ClusterConfigError(f"Ray is not installed for {sys.executable}: pip install -c constraints.txt '.[ray]'")
    return [sys.executable, "-m", RAY_TOOLS[name]]


def _network_choice(args: argparse.Namespace, environ: dict[str, str]) -> None:
    """--allow-network / ALLOW_RAY_NETWORK=1 need the address to listen on, named by the operator."""
    args.allow_network = args.allow_network or network_allowed(environ)
    args.node_ip = args.node_ip or environ.get("RAY_NODE_IP") or None
    if args.allow_network and not args.node_ip:
        raise ClusterConfigError(
            "--allow-network needs the address other hosts reach this one on: --node-ip ADDRESS (or RAY_NODE_IP)"
        )
    if not args.allow_network and (args.node_ip or args.dashboard_host not in (None, LOOPBACK)):
        raise ClusterConfigError(
            "--node-ip and --dashboard-host put Ray on the network: add --allow-network (token authentication "
            "stays on) to mean it"
        )


def _run(command: list[str], env: dict[str, str]) -> int:
    print("+ " + " ".join(command), file=sys.stderr)
    return subprocess.run(command, env=env, check=False).returncode


def start(args: argparse.Namespace, environ: dict[str, str]) -> int:
    env = ray_environment(environ, args.allow_network)
    status = _run(head_command(args), env)
    if status != 0:
        return 1
    if args.config is None:
        return 0
    dashboard = f"http://{LOOPBACK if not args.dashboard_host else args.dashboard_host}:{args.dashboard_port}"
    return 0 if _run([*_ray_tool("serve"), "deploy", str(args.config), f"--address={dashboard}"], env) == 0 else 1


def join(args: argparse.Namespace, environ: dict[str, str]) -> int:
    if not args.allow_network:
        raise ClusterConfigError("joining a head on another host puts Ray on the network: add --allow-network")
    env = ray_environment(environ, allow_network=True, create_token=False)
    command = [*_ray_tool("ray"), "start", f"--address={args.address}", f"--node-ip-address={args.node_ip}"]
    return 0 if _run(command + list(args.ray_args), env) == 0 else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    head = commands.add_parser("start", help="start the head (and deploy CONFIG, if given)")
    head.add_argument("config", nargs="?", type=Path, help="a Serve config, e.g. deploy/ray/medgemma-gpu.yaml")
    head.add_argument("--port", type=int, default=DEFAULT_GCS_PORT, help="the GCS port")
    head.add_argument("--dashboard-port", type=int, default=DEFAULT_DASHBOARD_PORT)
    head.add_argument("--dashboard-host", help="default 127.0.0.1; another address needs --allow-network")
    head.add_argument("--temp-dir", type=Path, help="Ray's session folder (default /tmp/ray)")
    member = commands.add_parser("join", help="start a node on this host that joins the head at ADDRESS")
    member.add_argument("address", help="the head's HOST:PORT")
    for command in (head, member):
        command.add_argument("--allow-network", action="store_true", help="listen on --node-ip (token stays on)")
        command.add_argument("--node-ip", help="the address other hosts reach this one on")
        command.add_argument(
            "--ray-args", type=shlex.split, default=[], help="more `ray start` options, e.g. '--num-gpus 8'"
        )
    commands.add_parser("stop", help="stop every Ray process of this user on this host (ray stop)")
    run = commands.add_parser("run", help="run a Ray command with this cluster's token: run -- serve status")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "join":
        args.dashboard_host = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    environ = dict(os.environ)
    try:
        if args.command in ("start", "join"):
            _network_choice(args, environ)
            return start(args, environ) if args.command == "start" else join(args, environ)
        env = ray_environment(environ, network_allowed(environ), create_token=False)
        if args.command == "stop":
            return 0 if _run([*_ray_tool("ray"), "stop"], env) == 0 else 1
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            raise ClusterConfigError("run needs a command: medgemma-xray-ray run -- serve status")
        os.execvpe(command[0], command, env)
    except ClusterConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
