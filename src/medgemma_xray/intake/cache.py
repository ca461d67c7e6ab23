"""Decoded films by content hash, under one byte budget, for every door: a film decoded once is shared by the main
page, /teaching, the API's follow-ups and a class of students on one case.

Least recently used first out. An entry larger than the whole budget is not kept (it is still returned to its
caller). Concurrent reads of the same bytes decode once: the first caller decodes, the others wait for its result
(or its error) instead of decoding the same film again. Thread-safe; nothing here decodes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

T = TypeVar("T")


@dataclass
class _Pending(Generic[T]):
    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None


class SharedCache(Generic[T]):
    def __init__(self, budget_bytes: int, size_of: Callable[[T], int]) -> None:
        self.budget_bytes = budget_bytes
        self._size_of = size_of
        self._entries: OrderedDict[str, tuple[T, int]] = OrderedDict()
        self._pending: dict[str, _Pending[T]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> T | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: str, value: T) -> bool:
        """Keep `value` under `key`; False if it alone exceeds the budget (then it is not kept)."""
        size = self._size_of(value)
        if size > self.budget_bytes:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= old[1]
            self._entries[key] = (value, size)
            self._held += size
            while self._held > self.budget_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._held -= evicted
        return True

    def get_or_make(self, key: str, make: Callable[[], T]) -> T:
        """The cached value, or make() run once however many threads ask for the same key at the same time. An
        error from make() reaches every caller waiting on it, and nothing is cached."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry[0]
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                pending = self._pending[key] = _Pending()
        if not owner:
            pending.done.wait()
            if pending.error is not None:
                raise pending.error
            return cast(T, pending.value)  # set whenever error is None
        try:
            value = make()
        except BaseException as exc:
            pending.error = exc
            raise
        else:
            pending.value = value
            self.put(key, value)
            return value
        finally:
            with self._lock:
                self._pending.pop(key, None)
            pending.done.set()

    def discard(self, key: str) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._held -= entry[1]

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._held

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
