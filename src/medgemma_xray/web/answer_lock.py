"""One answer at a time per conversation.

Two questions sent at once in one session were both answered, but the session's history kept only one of them
(each handler starts from the same case and the last to finish wins), and both ran against one KV cache entry. The
second is refused at once instead, with a message that says to wait.
"""

from __future__ import annotations

import contextlib
import threading

from medgemma_xray.inference_api.errors import RequestError

WAIT_MESSAGE = "Wait for the answer to your last question before asking another."


class AnswerPending(RequestError):
    """This conversation is already being answered."""


class AnswerLocks:
    def __init__(self) -> None:
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, conversation_id: str):
        """Held while one answer streams; raises AnswerPending if another holds it. Released however the answer
        ends (finished, failed, or the client went away and Gradio closed the generator)."""
        with self._lock:
            if conversation_id in self._busy:
                raise AnswerPending(WAIT_MESSAGE)
            self._busy.add(conversation_id)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(conversation_id)
