"""RSS of a process that opens and closes an engine bundle again and again, as a hot switch does, with and without
handing freed memory back to the system (medgemma_xray.serving.memory.return_freed_memory, which Served.close now calls).

    python -m benchmarks.switch_rss BUNDLE_DIR [--cycles 8]

Each mode runs in its own child process so neither sees the other's heap. Prints the RSS (MiB) after each cycle.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cycles(bundle: Path, cycles: int, trim: bool) -> list[float]:
    from medgemma_xray.serving.memory import return_freed_memory
    from medgemma_xray.trt_inference.trt_model import TRTInference

    after = []
    for _ in range(cycles):
        backend = TRTInference(bundle, require_verified=False)
        backend.warm_up()
        backend.close()
        del backend
        gc.collect()
        if trim:
            return_freed_memory()
        after.append(round(_rss_mib(), 1))
    return after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--child", choices=["trim", "no-trim"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_cycles(args.bundle, args.cycles, args.child == "trim")))
        return 0
    for mode in ("no-trim", "trim"):
        command = [sys.executable, "-m", "benchmarks.switch_rss", str(args.bundle), "--cycles", str(args.cycles)]
        result = subprocess.run([*command, "--child", mode], capture_output=True, text=True, check=True)
        print(f"{mode:8s} RSS after each open/close cycle (MiB): {result.stdout.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
