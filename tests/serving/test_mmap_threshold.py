"""With glibc's mmap threshold pinned (what the server does at start), a freed large block leaves RSS at once.

glibc raises its threshold to the size of every mmap'd block freed (up to 32 MiB); after that, blocks below it
come from the heap and stay in RSS once freed until malloc_trim. That is how ONNX Runtime's arena chunks, given
back after each prompt, still stepped the server's RSS up at each bundle switch (benchmarks/bundle_rss.py). The
child process does what the arena does, with ctypes: one 16 MiB block freed (the threshold rises to it), then 64
blocks of 2 MiB written and freed, with a 256 KiB block allocated after them so the heap cannot shrink from its
top. Without the pin, 128 MiB of the 128 stayed in RSS (Debian 12's glibc, 2026-12-03); with it, 0.2. Bytes only.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT

CHILD = """
import ctypes, json
from medgemma_xray.serving.memory import pin_mmap_threshold

libc = ctypes.CDLL("libc.so.6")
libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None

def rss_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))

def written(size):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    return block

pinned = pin_mmap_threshold()
libc.free(written(16 << 20))  # glibc raises its threshold to 16 MiB
before = rss_mib()
blocks = [written(2 << 20) for _ in range(64)]
guard = written(256 << 10)  # after the blocks, at the heap top: the heap cannot shrink from its end
for block in blocks:
    libc.free(block)
print(json.dumps({"pinned": pinned, "kept_mib": rss_mib() - before}))
"""


def test_freed_large_blocks_leave_rss_with_the_threshold_pinned():
    result = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["pinned"]
    assert measured["kept_mib"] < 16, f"{measured['kept_mib']:.0f} of 128 MiB freed stayed in RSS"


def test_an_operators_tunable_wins(monkeypatch):
    from medgemma_xray.serving.memory import pin_mmap_threshold

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4194304")
    assert not pin_mmap_threshold()
