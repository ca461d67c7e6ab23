"""An answer, read on a worker thread and handed to the event loop as it grows.

The service's answer is a blocking iterator of cumulative texts. Reading it one token per thread hop (what the API
did) costs a thread-pool round trip and an event-loop wake-up per token. Here one worker thread reads the whole
answer and publishes the latest text; the loop is woken only when it has taken everything published so far, so a
busy loop takes several tokens per wake-up, and the stream frames them together. The texts are cumulative, so
skipping an intermediate one loses nothing.

Closing: the loop calls stop() (the client left, a stop string matched); the reading thread sees it after the next
token and closes the answer there, which frees its decode slot at the scheduler's next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    text: str | None  # the answer so far (None before its first token)
    finished: bool
    error: BaseException | None = None


class AnswerFeed:
    def __init__(self, answer: Iterator[str], loop: asyncio.AbstractEventLoop) -> None:
        self._answer, self._loop = answer, loop
        self._lock = threading.Lock()
        self._text: str | None = None
        self._finished = False
        self._error: BaseException | None = None
        self._unread = False
        self._wake = asyncio.Event()
        self._done = asyncio.Event()
        self._stop = threading.Event()

    # --- the reading thread ---------------------------------------------------------------------------------------
    def read_all(self) -> None:
        """Runs on a worker thread until the answer ends, fails, or stop() is called."""
        error: BaseException | None = None
        try:
            for text in self._answer:
                self._publish(text)
                if self._stop.is_set():
                    break
        except Exception as exc:  # handed to the loop, which turns it into the client's error
            error = exc
        finally:
            close = getattr(self._answer, "close", None)
            if close is not None:
                close()  # on this thread, which is the one that ran it
            self._publish(None, finished=True, error=error)

    def _publish(self, text: str | None, finished: bool = False, error: BaseException | None = None) -> None:
        with self._lock:
            if text is not None:
                self._text = text
            self._finished, self._error = self._finished or finished, self._error or error
            wake, self._unread = not self._unread or finished, True
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._signal, finished)
            except RuntimeError:  # the event loop is closed: the server is stopping
                self._stop.set()

    def _signal(self, finished: bool) -> None:
        self._wake.set()
        if finished:
            self._done.set()

    # --- the event loop -------------------------------------------------------------------------------------------
    async def next(self, hold_until: float = 0.0) -> Progress:
        """Waits for something new, then returns all of it at once. hold_until (the loop's clock): a stream's next
        frame is not due before then, so tokens gather until then, unless the answer ends first."""
        await self._wake.wait()
        delay = hold_until - self._loop.time()
        if delay > 0 and not self._done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), delay)
        with self._lock:
            self._wake.clear()
            self._unread = False
            return Progress(self._text, self._finished, self._error)

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()
