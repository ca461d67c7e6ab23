"""Stop buttons answered on the server: the answer sees the request and ends as any answer ends.

The teaching page's Stop used Gradio's `cancels=`, which cancels the handler's task and closes its generator from
the event loop. Now and then (beside a busy core) that left Gradio's concurrency slot or the page's event stream in
a state where the next question was accepted and never answered, and the stopped answer's generator stayed open,
holding its lease. Here Stop only sets a flag; the streaming handler reads it at its next piece of text, closes the
service's stream (which frees the decode slot) and returns normally, so Gradio sees an ordinary end, the page keeps
what was said so far, and nothing is left open.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class AnswerStops:
    """The stop flags of the answers streaming now, by browser session. Entries live as long as their answer."""

    def __init__(self) -> None:
        self._running: dict[str, set[threading.Event]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def answering(self, session_id: str | None) -> Iterator[threading.Event]:
        """Held while one answer streams; the flag is set when its session asks to stop. A session without an id
        (an API client that sent none) gets a flag that nothing can set."""
        flag = threading.Event()
        if session_id is None:
            yield flag
            return
        with self._lock:
            self._running.setdefault(session_id, set()).add(flag)
        try:
            yield flag
        finally:
            with self._lock:
                flags = self._running.get(session_id, set())
                flags.discard(flag)
                if not flags:
                    self._running.pop(session_id, None)

    def stop(self, session_id: str | None) -> int:
        """Ask every answer of this session to stop; returns how many were streaming (0: nothing to stop)."""
        if session_id is None:
            return 0
        with self._lock:
            flags = list(self._running.get(session_id, ()))
        for flag in flags:
            flag.set()
        return len(flags)

    def running(self) -> int:
        """Answers streaming now (tests and memory bounds: an ended answer leaves nothing behind)."""
        with self._lock:
            return sum(len(flags) for flags in self._running.values())
