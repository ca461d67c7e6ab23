"""What a process serving an engine bundle on ONNX Runtime (CPU) keeps of its answers' memory, with the CPU arena's
shrinkage after prompt and vision runs (what the executor does, onnx_executor.ARENA_SHRINK_ENTRY) and without it
(the arena keeps every chunk until its session closes: before 2026-12-03), and with glibc's mmap threshold pinned
as the server does at start (serving/memory.pin_mmap_threshold).

    python -m benchmarks.bundle_rss BUNDLE_DIR [--answers 60] [--cycles 3]

Two experiments, each mode in its own child process so neither sees the other's heap:
- prompts: one answer (1 token) to a prompt of each length, its conversation forgotten; RSS kept over the RSS
  after a 1-word prompt, and the bytes glibc has mapped for large blocks (mallinfo2's hblkhd: the arena's chunks);
- cycles: as the soak's switches do, open the bundle, serve ANSWERS answers of varied lengths (6 client threads,
  1-3 turns each, 16-300 new tokens, questions of 1-40 filler phrases, 4 films) through the server's Scheduler,
  close it; RSS after loading, the largest RSS sampled while serving (every 0.1 s), RSS after the last answer, and
  the process's CPU seconds for the answers (the cost of mapping chunks again).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

from benchmarks.switch_rss import _rss_mib  # one reading of VmRSS for both RSS benchmarks

PROMPT_REPEATS = (1, 100, 400, 800)  # "findings? " x N: 484 to 1,884 tokens with the film on the demo bundle
CLIENTS = 6
MODES = {  # what each child runs with
    "keep": "arena keeps chunks (before 2026-12-03)",
    "shrink": "arena shrinks after prompts",
    "shrink+pin": "shrinks, glibc mmap threshold pinned at 1 MiB (the server)",
}


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _mapped_mib() -> float:
    """Bytes glibc holds in mmap'd blocks (hblkhd): ONNX Runtime's arena chunks are above its mmap threshold."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2().hblkhd / 2**20


def _open(bundle: Path, shrink: bool):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    backend = TRTInference(bundle, require_verified=False, executor="onnxruntime-cpu")
    if not shrink:
        cast(Any, backend.executor).shrink_after = None  # the arena keeps its chunks, as before 2026-12-03
    return backend


def _films():
    from PIL import Image

    from medgemma_xray.phantoms.films import chest_phantom

    return [Image.fromarray(chest_phantom(seed=seed)).convert("RGB") for seed in range(4)]


def _prompts(bundle: Path, shrink: bool) -> list[dict]:
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest

    backend = _open(bundle, shrink)
    film = _films()[0]
    rows, baseline = [], 0.0
    for repeats in PROMPT_REPEATS:
        request = GenerationRequest(image=film, turns=(ChatTurn("user", "findings? " * repeats),), max_new_tokens=1)
        backend.generate(request)
        gc.collect()
        if repeats == PROMPT_REPEATS[0]:
            baseline = _rss_mib()
        rows.append(
            {
                "prompt_tokens": backend.prompt_length(request),
                "rss_kept_mib": round(_rss_mib() - baseline, 1),
                "mapped_mib": round(_mapped_mib(), 1),
            }
        )
    backend.close()
    return rows


def _serve(backend, answers: int, seed: int) -> None:
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
    from medgemma_xray.serving.scheduler import Scheduler

    scheduler = Scheduler(backend, 2, 64)  # the server's defaults: GENERATION_CONCURRENCY=2, QUEUE_SIZE=64
    films, done, lock = _films(), [0], threading.Lock()

    def client(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        while True:
            with lock:
                if done[0] >= answers:
                    return
            conversation, film, turns = f"{seed}-{index}-{rng.random()}", films[rng.randrange(4)], []
            for turn in range(rng.randint(1, 3)):
                filler = "more detail please " * rng.randint(0, 40)
                turns.append(ChatTurn("user", f"Client {index}, turn {turn}: findings? {filler}"))
                request = GenerationRequest(
                    image=film,
                    turns=tuple(turns),
                    max_new_tokens=rng.choice([16, 64, 128, 300]),
                    conversation_id=conversation,
                )
                turns.append(ChatTurn("assistant", "".join(scheduler.submit(request).deltas(600, 600))))
                with lock:
                    done[0] += 1

    threads = [threading.Thread(target=client, args=(index,), name=f"client-{index}") for index in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    scheduler.close()


def _cycles(bundle: Path, shrink: bool, cycles: int, answers: int) -> list[dict]:
    from medgemma_xray.serving.memory import return_freed_memory

    rows = []
    for cycle in range(cycles):
        backend = _open(bundle, shrink)
        backend.warm_up()
        loaded, peak, stop = _rss_mib(), [0.0], threading.Event()

        def sample(peak: list[float] = peak, stop: threading.Event = stop) -> None:
            while not stop.wait(0.1):
                peak[0] = max(peak[0], _rss_mib())

        sampler = threading.Thread(target=sample, name="rss-sampler")
        sampler.start()
        cpu_started = time.process_time()
        _serve(backend, answers, cycle)
        cpu_s = time.process_time() - cpu_started
        stop.set()
        sampler.join()
        served = _rss_mib()
        backend.close()
        del backend
        gc.collect()
        return_freed_memory()
        rows.append(
            {
                "cycle": cycle + 1,
                "loaded_mib": round(loaded, 1),
                "peak_mib": round(peak[0], 1),
                "served_mib": round(served, 1),
                "closed_mib": round(_rss_mib(), 1),
                "cpu_s": round(cpu_s, 1),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--answers", type=int, default=60, help="answers per open/serve/close cycle")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--child", choices=[f"{e}-{m}" for e in ("prompts", "cycles") for m in MODES])
    args = parser.parse_args(argv)
    if args.child:
        experiment, mode = args.child.split("-", 1)
        shrink = mode != "keep"
        if mode == "shrink+pin":
            from medgemma_xray.serving.memory import pin_mmap_threshold

            pin_mmap_threshold()  # what the server does at start
        if experiment == "prompts":
            result = _prompts(args.bundle, shrink)
        else:
            result = _cycles(args.bundle, shrink, args.cycles, args.answers)
        print(json.dumps(result))
        return 0
    base = [sys.executable, "-m", "benchmarks.bundle_rss", str(args.bundle)]
    base += ["--answers", str(args.answers), "--cycles", str(args.cycles)]

    def child(name: str) -> list[dict]:
        done = subprocess.run([*base, "--child", name], capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    print("One answer per prompt, conversation forgotten: RSS kept over a 1-word prompt / mmap'd MiB")
    print("| prompt tokens | " + " | ".join(MODES.values()) + " |")
    print("|---|" + "---|" * len(MODES))
    for rows in zip(*(child(f"prompts-{mode}") for mode in MODES), strict=True):
        cells = " | ".join(f"{row['rss_kept_mib']} / {row['mapped_mib']}" for row in rows)
        print(f"| {rows[0]['prompt_tokens']} | {cells} |")
    print(f"\nOpen, serve {args.answers} answers ({CLIENTS} clients), close; RSS MiB and CPU s of the answers")
    print("| mode | cycle | loaded | peak while serving | after the last answer | after close | CPU s |")
    print("|---|---|---|---|---|---|---|")
    for mode, label in MODES.items():
        for row in child(f"cycles-{mode}"):
            print(
                f"| {label} | {row['cycle']} | {row['loaded_mib']} | {row['peak_mib']} | {row['served_mib']} "
                f"| {row['closed_mib']} | {row['cpu_s']} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
