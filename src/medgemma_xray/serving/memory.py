"""Giving freed memory back to the system after sessions expire.

glibc keeps freed blocks in its heaps for reuse; a block in the middle of a heap, or in one of the per-thread
arenas that Gradio's worker threads use, goes back to the system only on malloc_trim. Without it the server's RSS
keeps the high-water mark of every session that ever lived, which is what an operator (and MemoryMax) sees.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)
TRIM_DELAY_S = 1.0  # expiries come in bursts (Gradio checks once a second): one trim after the burst


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
