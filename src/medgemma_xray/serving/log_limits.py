"""A log filter that keeps a flood from one log call from rotating every earlier line away.

Under 1,100 half-open connections, asyncio wrote 121,217 "accept() out of system resource" records (51 MiB) in a
minute and the rotating log dropped all six files: the evidence of the attack went with them. Here each log call
(logger, file and line) has a token bucket: a burst, then `per_minute` records a minute; the rest are counted, and
one summary record a minute says how many were dropped and from where. The summary names the call's format string
only, never its arguments (which may carry what a client sent).
"""

from __future__ import annotations

import logging
import threading
import time

BURST = 50  # records one call may write at once before the rate applies
SUMMARY_EVERY_S = 60.0


class RepeatLimiter(logging.Filter):
    """Attach to a handler. Thread-safe; the clock is injectable for tests."""

    def __init__(self, per_minute: int, burst: int = BURST, clock=time.monotonic) -> None:
        super().__init__()
        self.rate_per_s = per_minute / 60.0
        self.burst = burst
        self.clock = clock
        self._buckets: dict[tuple, list[float]] = {}  # site -> [tokens, last refill, dropped, last summary]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "repeat_summary", False):
            return True
        site = (record.name, record.pathname, record.lineno, record.levelno)
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(site)
            if bucket is None:
                if len(self._buckets) > 10_000:  # the sites are code locations: this only bounds a pathology
                    self._buckets.clear()
                bucket = self._buckets[site] = [float(self.burst), now, 0, now]
            tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate_per_s)
            bucket[1] = now
            summary = None
            if bucket[2] and now - bucket[3] >= SUMMARY_EVERY_S:
                summary, bucket[2], bucket[3] = bucket[2], 0, now
            if tokens >= 1:
                bucket[0] = tokens - 1
                keep = True
            else:
                bucket[0] = tokens
                bucket[2] += 1
                keep = False
        if summary:
            self._summarise(record, int(summary))  # a count, kept in a list of floats
        return keep

    def _summarise(self, record: logging.LogRecord, dropped: int) -> None:
        template = str(record.msg)[:120]
        logging.getLogger("medgemma_xray.serving.log_limits").warning(
            "dropped %d repeats of a log record from %s (%s:%d, %r) in the last minute or more",
            dropped,
            record.name,
            record.filename,
            record.lineno,
            template,
            extra={"repeat_summary": True},
        )
