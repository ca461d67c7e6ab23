"""Errors of the backend contract, by whose fault they are.

The serving layer sorts failures with these types and nothing else: a RequestError is the user's to fix and never
counts against a backend; anything else from a backend is a backend failure (the circuit breaker counts it).
"""


class RequestError(Exception):
    """The request cannot be served as asked (too long, empty, malformed). The message says what to change."""


class ConversationTooLongError(RequestError):
    """The conversation plus the answer would not fit the backend's context."""


class BackendClosedError(RuntimeError):
    """The backend was closed (for example after a hot switch) and can no longer serve."""


class NoFreeSlotError(RuntimeError):
    """Every KV slot of the backend is in use. The contract evicts an idle conversation and tries again."""


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name if empty), at most 300 characters: what a log
    record or a status line shows of it."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]
