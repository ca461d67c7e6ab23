"""Many API requests at once that carry one large film: the server's peak memory, and its answers.

    python -m benchmarks.openai_film_flood --requests 40 --size 6000 --output DIR [--pythonpath OTHER/src ...]

Starts the real server (app.py, the demo checkpoint, on a free loopback port) once per source tree given (this
tree's by default; --pythonpath runs another tree's code, e.g. a checkout of an older commit, side by side in one
run), sends --requests chat completions at once, each with the same --size x --size phantom as a PNG data: URL and
max_tokens 1, and reads the server's peak resident memory (VmHWM in /proc/PID/status) before and after. The
phantom is made once and kept in DIR (making a 6000 x 6000 one takes minutes on a busy two-core host).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def film_png(size: int, folder: Path) -> bytes:
    path = folder / f"phantom-{size}.png"
    if not path.exists():
        from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize

        path.write_bytes(png_bytes(quantize(chest_phantom(rows=size, cols=size, seed=3), 8)))
    return path.read_bytes()


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def start_server(pythonpath: str | None, folder: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    from medgemma_xray.serving.settings import DEMO_MODEL_DIR

    env = {key: value for key, value in os.environ.items() if key not in ("MODEL_PATH", "PYTHONPATH")}
    # One checkpoint for every tree: this tree's demo (another tree's package looks for its own models/ folder).
    env.update(LOG_DIR=str(folder), GENERATION_CONCURRENCY="4", MODEL_PATH=str(DEMO_MODEL_DIR))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    process = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port), "--log_file", str(folder / "server.log")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server stopped at start; see {folder / 'server.log'}")
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def flood(url: str, film_url: str, requests: int) -> dict:
    model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
    body = {
        "model": model,
        "max_tokens": 1,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": film_url}}, {"type": "text", "text": "?"}],
            }
        ],
    }
    statuses: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            status = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1800).status_code
        except httpx.HTTPError:
            status = 0
        with lock:
            statuses.append(status)

    started = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"wall_s": time.perf_counter() - started, "statuses": {s: statuses.count(s) for s in sorted(set(statuses))}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--size", type=int, default=6000)
    parser.add_argument("--pythonpath", action="append", default=[], help="another tree's src/ to run as well")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    film_url = "data:image/png;base64," + base64.b64encode(film_png(args.size, args.output)).decode()
    rows = []
    for tree in [None, *args.pythonpath]:
        with tempfile.TemporaryDirectory() as folder:
            process, url = start_server(tree, Path(folder))
            try:
                before = peak_rss_mib(process.pid)
                result = flood(url, film_url, args.requests)
                result.update(
                    tree=tree or "this tree", peak_rss_before_mib=before, peak_rss_after_mib=peak_rss_mib(process.pid)
                )
            finally:
                process.terminate()
                process.wait(60)
        rows.append(result)
    (args.output / "openai_film_flood.json").write_text(json.dumps(rows, indent=2))
    print(
        f"| code | peak RSS before (MiB) | after (MiB) | wall (s) | statuses |  ({args.requests} requests, one {args.size}^2 film)"
    )
    for row in rows:
        print(
            f"| {row['tree']} | {row['peak_rss_before_mib']:.0f} | {row['peak_rss_after_mib']:.0f} | "
            f"{row['wall_s']:.1f} | {row['statuses']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
