"""Circuit breaker for the TensorRT path: N consecutive failures (errors or timeouts) open it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class BreakerState:
    state: str  # "closed" (TensorRT trusted), "open" (fell back to PyTorch)
    consecutive_failures: int
    threshold: int
    last_failure: str | None
    tripped_at: float | None  # time.time() of the last trip
    trips: int


class CircuitBreaker:
    def __init__(self, threshold: int = 5) -> None:
        if threshold < 1:
            raise ValueError(f"breaker threshold must be >= 1, got {threshold}")
        self.threshold = threshold
        self._lock = threading.Lock()
        self._failures = 0
        self._open = False
        self._last_failure: str | None = None
        self._tripped_at: float | None = None
        self._trips = 0

    def record_success(self) -> None:
        with self._lock:
            self._failures = 0

    def record_failure(self, reason: str) -> bool:
        """Count one failure. True exactly once: when this failure trips the breaker."""
        with self._lock:
            self._failures += 1
            self._last_failure = reason
            if self._open or self._failures < self.threshold:
                return False
            self._open, self._tripped_at = True, time.time()
            self._trips += 1
            return True

    def reset(self) -> None:
        """Close the breaker: an operator switched back to TensorRT on purpose."""
        with self._lock:
            self._open, self._failures = False, 0

    def snapshot(self) -> BreakerState:
        with self._lock:
            return BreakerState(
                state="open" if self._open else "closed",
                consecutive_failures=self._failures,
                threshold=self.threshold,
                last_failure=self._last_failure,
                tripped_at=self._tripped_at,
                trips=self._trips,
            )
