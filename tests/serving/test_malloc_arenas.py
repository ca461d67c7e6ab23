"""With the arena limit (what the server does at start), threads share two glibc arenas instead of one each.

glibc gives each new thread that allocates an arena of its own, up to 8 per core, and keeps every arena for the
life of the process; each keeps its own partly used pages, which is how the server's heaps stepped up at each
switch to a bundle (ONNX Runtime starts new session threads every time). The child starts 12 threads that each
allocate and free blocks at once, then counts the arenas with malloc_info (devtools/rss_probe.arena_count)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

CHILD = """
import ctypes, json, sys, threading
from devtools.rss_probe import arena_count
from medgemma_xray.serving.memory import limit_malloc_arenas

limited = limit_malloc_arenas() if sys.argv[1] == "limit" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
started = threading.Barrier(12)

def work():
    started.wait()  # all 12 allocate at once, as a server's workers do
    blocks = [libc.malloc(4096) for _ in range(200)]
    for block in blocks:
        libc.free(block)

threads = [threading.Thread(target=work) for _ in range(12)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"limited": limited, "arenas": arena_count()}))
"""


def arenas(mode: str, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")} | env
    result = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")
def test_threads_share_two_arenas_with_the_limit():
    unlimited = arenas("none")
    assert unlimited["arenas"] > 2, unlimited  # glibc's default: one per thread here (the test can fail)
    limited = arenas("limit")
    assert limited["limited"] is True
    assert limited["arenas"] <= 2, limited


def test_an_operators_setting_wins():
    assert arenas("limit", MALLOC_ARENA_MAX="4")["limited"] is False
    assert arenas("limit", GLIBC_TUNABLES="glibc.malloc.arena_max=3")["limited"] is False
