"""A browser session's state, changed in place: what a page's gr.State holds.

Gradio hands a State's value to each handler by reference and stores whatever a handler returns for it. With an
immutable value in the State, an answer that streams for a minute returns the value it started from, and so writes
the old film back over a new upload that came in meanwhile. Here the State holds one SessionSlot for the whole
session; handlers change what it holds under its lock, and a streaming answer changes it only if it still holds
the value the answer started on (`replace_if`). Returning the slot itself (to refresh the State's time-to-live)
can never bring an old value back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class SessionSlot(Generic[T]):
    def __init__(self, value: T) -> None:
        self._value = value
        self._lock = threading.Lock()
        self.answer_token: str | None = None  # the running answer's Stop token (web.asking); never sent to a client
        self.exports: Any = None  # the last export's files (the page removes them when replaced)

    def __deepcopy__(self, memo: dict) -> SessionSlot[T]:
        """gr.State deep-copies its initial value for each new session: a new slot with the same initial value."""
        return type(self)(self._value)

    @property
    def value(self) -> T:
        with self._lock:
            return self._value

    def set(self, value: T) -> T:
        """Hold `value` from now on; returns what was held."""
        with self._lock:
            old, self._value = self._value, value
            return old

    def replace_if(self, expected: T, value: T) -> bool:
        """Hold `value` only if the slot still holds `expected` (the same object); True if it did."""
        with self._lock:
            if self._value is not expected:
                return False
            self._value = value
            return True

    def update(self, change: Callable[[T], T]) -> T:
        """Apply `change` to the held value atomically; returns the new value."""
        with self._lock:
            self._value = change(self._value)
            return self._value


def slot_value(state: object, default: T) -> T:
    """What a State argument holds: a SessionSlot's value, or `default` for anything else (a client that sent
    its own value for a State it cannot hold)."""
    if isinstance(state, SessionSlot) and isinstance(state.value, type(default)):
        return state.value
    return default
