"""How much of a window the GPU spends on the fast path's work, from device events around each launch.

A CUDA profile perturbs what it measures here: stopping it turns tens of thousands of kernel records into Python
objects while holding the GIL, so the scheduler's loop stalls for seconds (H200, 2026-12-03: a 48-student round's
follow-up TTFT p95 went to 4.3 s behind the profiler). Events cost two records a launch and are read only at the
end: the sum of each launch's device time over the time from the first launch's start to the last one's end is
the share of the window the GPU was busy with them (one stream: the launches never overlap). Inert on CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class BusyTimer:
    def __init__(self) -> None:
        self._pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.active = False

    def start(self) -> None:
        self._pairs = []
        self.active = torch.cuda.is_available()

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        """Time the device work queued inside the block (nothing when the timer is not started)."""
        if not self.active:
            yield
            return
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        try:
            yield
        finally:
            end.record()
            self._pairs.append((begin, end))

    def stop(self) -> dict | None:
        """Stop; wait for the last timed launch; the figures (None when nothing was timed)."""
        self.active = False
        pairs, self._pairs = self._pairs, []
        if not pairs:
            return None
        pairs[-1][1].synchronize()
        busy = sum(begin.elapsed_time(end) for begin, end in pairs)
        span = pairs[0][0].elapsed_time(pairs[-1][1])
        return {
            "launches": len(pairs),
            "busy_ms": busy,
            "span_ms": span,
            "busy_fraction": busy / span if span else None,
        }
