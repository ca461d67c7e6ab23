"""The UI's login as the API's bearer token "name:password".

A verified token is remembered by its SHA-256 for a few minutes, so a streaming client does not pay scrypt on every
request. The check itself is web.login_guard's: scrypt in a bounded worker pool, never on the event loop, and an
address with too many failed logins refused with 429 and Retry-After before any check.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from medgemma_xray.web.login_guard import throttled_message
from medgemma_xray.web.openai.errors import ApiError

if TYPE_CHECKING:
    from medgemma_xray.web.login_guard import LoginGuard

logger = logging.getLogger(__name__)

REMEMBERED_TOKENS = 256


def _refusal(message: str) -> ApiError:
    return ApiError(401, message, kind="authentication_error", code="invalid_api_key")


class BearerCheck:
    def __init__(self, guard: LoginGuard | None, remember_s: float = 300.0) -> None:
        self.guard, self.remember_s = guard, remember_s
        self._verified: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    async def user(self, authorization: str | None, address: str | None = None) -> str | None:
        """The login name; None when no login is configured. Raises ApiError 401, or 429 for an address with too
        many failed logins."""
        if self.guard is None:
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
        wait = self.guard.failures.retry_after(address)
        if wait is not None:
            logger.warning("API login refused: the address is throttled")
            raise ApiError(
                429, throttled_message(wait), kind="rate_limit_error", code="too_many_failed_logins", retry_after_s=wait
            )
        if not await self.guard.verify(name, password):
            self.guard.failures.failed(address)
            logger.warning("API login refused")
            raise _refusal("The API key (name:password) is not valid.")
        self.guard.failures.succeeded(address)
        self.guard.remember(f"bearer:{hashlib.sha256(token.encode('utf-8', 'surrogatepass')).hexdigest()}", name)
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
