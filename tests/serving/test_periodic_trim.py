"""The server's periodic malloc_trim (serving/memory.PeriodicTrim) gives back freed pages that free() keeps.

A closed bundle leaves free chunks in the middle of glibc's heaps, under blocks still in use, and the next phase's
passing allocations make their pages resident again; only malloc_trim returns them (the soak's PyTorch phases after
a bundle sat 50-80 MiB higher: benchmarks/results/2026-12-04-soak-rss-by-layer.md). The child does that with ctypes:
2,048 blocks of 64 KiB written (below glibc's mmap threshold, so in the heap), then seven in eight freed, the
eighth kept, so no heap can shrink from its top. It reports how much of the freed 112 MiB is still in RSS, without
the trimmer and after the trimmer's first trim."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

CHILD = """
import ctypes, json, sys, time
from medgemma_xray.serving.memory import PeriodicTrim

libc = ctypes.CDLL("libc.so.6")
libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None

def rss_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))

before = rss_mib()
blocks = []
for _ in range(2048):
    block = libc.malloc(64 << 10)
    ctypes.memset(block, 1, 64 << 10)
    blocks.append(block)
for index, block in enumerate(blocks):
    if index % 8:
        libc.free(block)
trims = None
if sys.argv[1] == "trim":
    trimmer = PeriodicTrim(every_s=0.05)
    assert trimmer.start()
    deadline = time.monotonic() + 60
    while trimmer.trims < 1 and time.monotonic() < deadline:  # waits for the event, not for a guessed time
        time.sleep(0.01)
    trimmer.close()
    trims = trimmer.trims
    alive = any(t.name == "malloc-trim" for t in __import__("threading").enumerate())
    assert not alive, "the trim thread outlived close()"
print(json.dumps({"trims": trims, "kept_mib": rss_mib() - before}))
"""


def kept(mode: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, mode], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_pages_in_the_middle_of_the_heap_leave_rss_at_the_next_trim():
    untrimmed = kept("none")
    assert untrimmed["kept_mib"] > 100, untrimmed  # free() alone keeps them (this is what the test guards against)
    trimmed = kept("trim")
    assert trimmed["trims"] >= 1
    assert trimmed["kept_mib"] < 40, f"{trimmed['kept_mib']:.0f} MiB of 128 written stayed after a trim"


def test_close_stops_the_thread_at_once():
    from medgemma_xray.serving.memory import PeriodicTrim

    trimmer = PeriodicTrim(every_s=3600)
    assert trimmer.start()
    trimmer.close(timeout_s=10)
    assert trimmer._thread is None and trimmer.trims == 0
