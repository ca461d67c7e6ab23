"""Command line over the control channel, for the operator scripts: status and switch.

Exit status: 0 success; 1 the server refused or the switch failed (current mode kept); 3 not reachable.
`status` (given --pid of a live process by status_gradio.sh) instead answers for a server it cannot reach:
150 "starting" (the channel does not answer yet: loading the model, or hung), 4 "unknown" (this user may not
use the channel). With --json it prints one JSON object in every case.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from medgemma_xray.engine_bundle.defaults import DEMO_NOTICE
from medgemma_xray.engine_bundle.gate import UNVERIFIED_NOTICE, gate_summary
from medgemma_xray.inference_api.types import Mode
from medgemma_xray.serving.control import send_command

STATUS_STARTING = 150  # LSB leaves 150-199 to applications
STATUS_UNKNOWN = 4


def mode_label(mode: str | None) -> str:
    try:
        return Mode.parse(mode).label if mode else "none"
    except ValueError:
        return str(mode)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{days}d " if days else "") + f"{hours:02d}:{minutes:02d}:{secs:02d}"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.3f} ms"


def checkpoint_line(backend: dict) -> str:
    """Which checkpoint serves and what it can do beyond describing a film (engine_bundle/checkpoint_profile)."""
    capabilities = backend.get("capabilities") or []
    kind = backend.get("checkpoint_kind") or "n/a"
    return f"{kind}; " + (f"can: {', '.join(capabilities)}" if capabilities else "no localisation, no prior comparison")


def format_status(status: dict, pid: int | None) -> str:
    backend = status.get("backend") or {}
    lines = [
        f"Status: running (PID {pid if pid else '?'}, uptime {_duration(status['uptime_s'])})",
        f"URL: {status['url']}",
        f"Ready: {'yes' if status['ready'] else 'no (warming up)'}",
        f"Inference Mode: {status.get('mode_label') or mode_label(status['mode'])}",
        f"TRT Engine: {status['trt_engine']}",
        f"Executor: {backend.get('executor', 'n/a')}",
        f"Precision: {str(backend.get('precision', 'n/a')).upper()}",
        f"Model: {backend.get('model_id', 'n/a')}"
        + (f"  [{backend.get('demo_notice') or DEMO_NOTICE}]" if backend.get("is_demo") else ""),
        f"Checkpoint: {checkpoint_line(backend)}",
        f"Device: {backend.get('device', 'n/a')}",
    ]
    measured_on = (backend.get("details") or {}).get("accuracy_measured_on")
    if backend.get("unverified_reason"):
        lines.append(
            f"Engine accuracy: {UNVERIFIED_NOTICE} ({backend['unverified_reason']}); served by ALLOW_UNVERIFIED_PLANS=1"
        )
    elif measured_on:
        lines.append(f"Engine accuracy measured on: {measured_on}")
    gate = gate_summary((backend.get("details") or {}).get("accuracy"))
    if gate:
        lines.append(f"Engine gate: {gate}")
    switch = status.get("last_switch")
    if switch:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(switch["at"]))
        lines.append(
            f"Last switch: {switch.get('source_label') or mode_label(switch['source'])} -> "
            f"{switch.get('target_label') or mode_label(switch['target'])} at {when} ({switch['reason']}); "
            f"interruption {_ms(switch['interruption_s'])}, load {switch['load_s']:.2f} s"
        )
    else:
        lines.append("Last switch: none")
    breaker = status["breaker"]
    line = f"Circuit breaker: {breaker['state']} ({breaker['consecutive_failures']}/{breaker['threshold']} consecutive engine failures"
    line += f", {breaker['trips']} trips)"
    if breaker["state"] == "open":
        line += f"; fell back to PyTorch: {breaker['last_failure']}"
    lines.append(line)
    requests, latency = status["requests"], status["latency"]
    lines.append(
        f"Requests: {int(requests['requests'])}, errors: {int(requests['errors'])}, "
        f"latency p50 {_ms(latency['p50_s'])}, p99 {_ms(latency['p99_s'])}, waiting {status['requests_waiting']}, running {status['requests_running']}"
    )
    gpus = status.get("gpus") or []
    if gpus:
        for gpu in gpus:
            lines.append(
                f"GPU {gpu['index']} memory: {gpu['used_bytes'] / 2**30:.1f} / {gpu['total_bytes'] / 2**30:.1f} GiB, "
                f"utilisation {gpu['util_percent']}%"
            )
    else:
        lines.append("GPU memory: n/a (no NVIDIA GPU visible)")
    return "\n".join(lines)


def unreachable_status(args: argparse.Namespace, exc: Exception) -> int:
    """A live process whose channel does not answer is starting (or hung), not stopped."""
    if isinstance(exc, PermissionError):
        code, state, running = STATUS_UNKNOWN, "unknown", True
        detail = f"PID {args.pid} is alive, but its control channel refused this user ({exc}): run as its user or root"
    else:
        code, state, running = STATUS_STARTING, "starting", True
        detail = (
            f"PID {args.pid} is alive, but its control channel at {args.socket} does not answer yet ({exc}): "
            f"it is loading the model, or it hangs; see {args.log or 'its log'}"
        )
    if args.json:
        print(json.dumps({"running": running, "state": state, "pid": args.pid, "ready": False, "detail": detail}))
    else:
        print(f"Status: {state} ({detail})")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the server's reply")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status")
    status.add_argument("--json", action="store_true")
    status.add_argument("--pid", type=int)
    status.add_argument("--log", help="the server's log, named when it does not answer")
    switch = commands.add_parser("switch")
    switch.add_argument("mode", choices=[mode.value for mode in Mode])
    args = parser.parse_args(argv)

    payload = {"command": args.command.replace("-", "_")}
    if args.command == "switch":
        payload["mode"] = args.mode
    try:
        reply = send_command(args.socket, payload, timeout_s=args.timeout)
    except (OSError, ValueError) as exc:
        if args.command == "status" and args.pid is not None:
            return unreachable_status(args, exc)
        print(f"error: cannot reach the server's control channel at {args.socket}: {exc}", file=sys.stderr)
        return 3

    if args.command == "status":
        if not reply.get("ok") and args.pid is not None:
            return unreachable_status(args, PermissionError(reply.get("error")))
        if args.json:
            body = {"running": True, "state": "running", "pid": args.pid, **reply.get("status", {})}
            print(json.dumps(body, indent=2, default=str))
        else:
            print(format_status(reply["status"], args.pid))
        return 0
    if not reply.get("ok"):
        print(f"error: {reply.get('error')}", file=sys.stderr)
        if reply.get("status"):
            print(f"Inference Mode still: {mode_label(reply['status']['mode'])}", file=sys.stderr)
        return 1
    if args.command == "switch":
        record, status = reply["switch"], reply["status"]
        print(f"Inference Mode: {status.get('mode_label') or mode_label(status['mode'])}")
        print(f"TRT Engine: {status['trt_engine']}")
        print(
            f"Switch: {record['reason']}; load {record['load_s']:.2f} s, interruption {_ms(record['interruption_s'])}"
        )
    else:
        print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
