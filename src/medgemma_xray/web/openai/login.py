"""The UI's login as the API's bearer token "name:password".

A verified token is remembered by its SHA-256 for a few minutes, so a streaming client does not pay scrypt on every
request. scrypt itself runs in a worker thread, at most SCRYPT_AT_ONCE at a time, never on the event loop: 48
clients with wrong keys must not stall /healthz.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from medgemma_xray.web.openai.errors import ApiError

if TYPE_CHECKING:
    from anyio import CapacityLimiter

logger = logging.getLogger(__name__)

SCRYPT_AT_ONCE = 2
REMEMBERED_TOKENS = 256


def _refusal(message: str) -> ApiError:
    return ApiError(401, message, kind="authentication_error", code="invalid_api_key")


class BearerCheck:
    def __init__(self, auth: Callable[[str, str], bool] | None, remember_s: float = 300.0) -> None:
        self.auth, self.remember_s = auth, remember_s
        self._verified: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._limiter: CapacityLimiter | None = (
            None  # an anyio.CapacityLimiter, made on the event loop that first needs it
        )

    async def user(self, authorization: str | None) -> str | None:
        """The login name; None when no login is configured. Raises ApiError 401 otherwise."""
        if self.auth is None:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        name, colon, password = token.partition(":")
        if scheme.lower() != "bearer" or not colon or not name:
            raise _refusal(
                "This server requires a login: send the API key 'name:password' of a login user as a bearer token."
            )
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        remembered = self._remembered(digest)
        if remembered is not None:
            return remembered
        import anyio

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(SCRYPT_AT_ONCE)
        if not await anyio.to_thread.run_sync(self.auth, name, password, limiter=self._limiter):
            logger.warning("API login refused")
            raise _refusal("The API key (name:password) is not valid.")
        with self._lock:
            self._verified[digest] = (name, time.monotonic())
            while len(self._verified) > REMEMBERED_TOKENS:
                self._verified.popitem(last=False)
        return name

    def _remembered(self, digest: str) -> str | None:
        with self._lock:
            known = self._verified.get(digest)
            if known is not None and time.monotonic() - known[1] < self.remember_s:
                return known[0]
        return None
