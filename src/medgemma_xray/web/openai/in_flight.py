"""One answer at a time per conversation: a second one would race the first for the same KV state."""

from __future__ import annotations

import threading

from medgemma_xray.web.openai.errors import ApiError


class InFlightConversations:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[str] = set()

    def claim(self, conversation_id: str | None) -> None:
        if conversation_id is None:
            return
        with self._lock:
            if conversation_id in self._running:
                raise ApiError(
                    409,
                    "An answer in this conversation is still running; wait for it before asking the next question.",
                    param="conversation_id",
                    code="conversation_busy",
                )
            self._running.add(conversation_id)

    def release(self, conversation_id: str | None) -> None:
        if conversation_id is not None:
            with self._lock:
                self._running.discard(conversation_id)
