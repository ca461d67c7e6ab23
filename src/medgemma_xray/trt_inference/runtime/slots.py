"""A fixed number of decoder slots, lent to sequences and waited on with a timeout (both executors use it)."""

from __future__ import annotations

import queue
from typing import Generic, TypeVar

from medgemma_xray.inference_api.errors import NoFreeSlotError

Slot = TypeVar("Slot")
DEFAULT_SLOT_TIMEOUT_S = 30.0


class SlotPool(Generic[Slot]):
    def __init__(self, slots: list[Slot]) -> None:
        if not slots:
            raise ValueError("sequence_slots must be at least 1")
        self.capacity = len(slots)
        self._free: queue.Queue[Slot] = queue.Queue()
        for slot in slots:
            self._free.put(slot)

    def acquire(self, timeout_s: float | None = DEFAULT_SLOT_TIMEOUT_S) -> Slot:
        """A free slot; waits up to timeout_s (None: forever, 0: not at all), then raises NoFreeSlotError."""
        try:
            if timeout_s is not None and timeout_s <= 0:
                return self._free.get_nowait()
            return self._free.get(timeout=timeout_s)
        except queue.Empty:
            raise NoFreeSlotError(
                f"all {self.capacity} decoder slots are in use and none was freed within {timeout_s} s"
            ) from None

    def release(self, slot: Slot) -> None:
        self._free.put(slot)

    @property
    def free(self) -> int:
        return self._free.qsize()
