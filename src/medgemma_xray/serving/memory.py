"""Giving freed memory back to the system after sessions expire.

glibc keeps freed blocks in its heaps for reuse; a block in the middle of a heap, or in one of the per-thread
arenas that Gradio's worker threads use, goes back to the system only on malloc_trim. Without it the server's RSS
keeps the high-water mark of every session that ever lived, which is what an operator (and MemoryMax) sees.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

logger = logging.getLogger(__name__)
TRIM_DELAY_S = 1.0  # expiries come in bursts (Gradio checks once a second): one trim after the burst
M_MMAP_THRESHOLD = -3  # mallopt's parameter numbers (malloc.h)
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 1 << 20
ARENA_MAX = 2
TRIM_EVERY_S = 60.0


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def pin_mmap_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Blocks of threshold_bytes or more are mmap'd and unmapped when freed, for the whole life of the process.

    glibc starts at 128 KiB and raises the threshold to the size of every mmap'd block freed, up to 32 MiB. ONNX
    Runtime's arena hands its chunks back after each prompt (onnx_executor.ARENA_SHRINK_ENTRY); once the first of
    them was freed, the next ones came from the heap instead, where a freed chunk stays in RSS until malloc_trim.
    Opening, serving and closing the demo bundle three times (benchmarks/bundle_rss.py) kept
    RSS after loading at 100 -> 102 -> 103 MiB with the threshold pinned, against 114 -> 163 -> 162 MiB without:
    the bundle's level no longer steps up at each switch. The cost is an mmap and its page faults per block of
    1 MiB or more; the arena asks for such blocks once per prompt, not per token. An operator's own
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=... wins. False where the C library is not glibc."""
    if "glibc.malloc.mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold_bytes))


def limit_malloc_arenas(arena_max: int = ARENA_MAX) -> bool:
    """At most arena_max glibc arenas for the whole process, from now on.

    glibc gives a thread that finds the arenas busy an arena of its own, up to 8 per core (16 on this 2-core host),
    and never gives an arena back. Gradio's workers, the scheduler and ONNX Runtime's session threads (new ones at
    every switch to a bundle) spread their blocks over all of them, and each arena keeps its own partly used pages.
    Under the soak's load with a switch every 5 minutes, the heaps' size stepped up 12-19 MiB at each round trip
    (benchmarks/results/2026-12-04-soak-rss-by-layer.md). Two arenas is what MALLOC_ARENA_MAX=2 gives, the usual
    setting for long-running multi-threaded servers; the cost is lock contention in malloc, small beside the model.
    An operator's own MALLOC_ARENA_MAX or GLIBC_TUNABLES=glibc.malloc.arena_max=... wins. Call it before threads
    start: arenas made earlier stay. False where the C library is not glibc."""
    if "MALLOC_ARENA_MAX" in os.environ or "glibc.malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arena_max))


def return_freed_memory() -> bool:
    """malloc_trim(0) where the C library is glibc; False elsewhere (musl, macOS), where there is nothing to do."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


class TrimSoon:
    """Call after freeing a session's state: one malloc_trim runs TRIM_DELAY_S later on the event loop that
    called (Gradio expires state from its loop), however many sessions expired meanwhile; off a loop, at once."""

    def __init__(self) -> None:
        self._scheduled = False

    def __call__(self) -> None:
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return_freed_memory()
            return
        if not self._scheduled:
            self._scheduled = True
            loop.call_later(TRIM_DELAY_S, self._run)

    def _run(self) -> None:
        self._scheduled = False
        return_freed_memory()


class PeriodicTrim:
    """malloc_trim once a minute, from a thread its owner starts and closes (keep_heap_small's caller).

    Trimming when something is freed is not enough. A closed bundle leaves 80-130 MiB of free chunks in the
    middle of the heaps, under blocks still in use, so the heap cannot shrink. The PyTorch phase's passing
    allocations land in those chunks again, and a freed block's pages stay resident until the next trim. Under
    the soak's load, RSS in the PyTorch phases after a bundle sat 51 and 103 MiB above the phase before the first
    bundle, with the in-use heap unchanged (benchmarks/results/2026-12-04-soak-rss-by-layer.md). jemalloc's
    decay thread does this for its own heaps. In a standalone test on a 380 MiB heap a trim took 8-40 ms; ctypes
    releases the GIL meanwhile, and other threads' mallocs wait on the arena lock only for that walk."""

    def __init__(self, every_s: float = TRIM_EVERY_S) -> None:
        self.every_s = every_s
        self.trims = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """False where the C library has no malloc_trim (not glibc): nothing to do there."""
        if getattr(_libc(), "malloc_trim", None) is None:
            return False
        self._thread = threading.Thread(target=self._run, name="malloc-trim", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            return_freed_memory()
            self.trims += 1

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


def keep_heap_small(log: logging.Logger) -> PeriodicTrim:
    """All three of this module's settings for a long-running serving process, logged: the mmap threshold pinned,
    at most ARENA_MAX arenas, and a started PeriodicTrim, which the caller owns and closes. The HTTP server, a Ray
    model replica and the Ray ingress each call it once, as early as they can: arenas made before it stay."""
    if pin_mmap_threshold():
        log.info("blocks of %d KiB or more are mmap'd (glibc's threshold pinned)", MMAP_THRESHOLD_BYTES // 1024)
    if limit_malloc_arenas():
        log.info("at most %d malloc arenas (glibc's limit set)", ARENA_MAX)
    trimmer = PeriodicTrim()
    if trimmer.start():
        log.info("freed heap memory is returned every %.0f s (malloc_trim)", trimmer.every_s)
    return trimmer
