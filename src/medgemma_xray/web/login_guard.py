"""Login checks for every door: scrypt off the event loop and bounded, and failed logins throttled per address.

scrypt (web/http_auth.py) costs tens of milliseconds and 16 MiB a check, on purpose. Gradio's /login route is a
coroutine that calls a plain auth callable on the event loop, and 48 clients with wrong keys held /healthz for
seconds. So every check runs in a worker thread, at most SCRYPT_AT_ONCE at a time (requests beyond wait as
coroutines, holding no thread), and the callable Gradio gets is a coroutine function.

An address that failed FREE_FAILURES times in a row is refused without a check (HTTP 429, Retry-After) for
BACKOFF_S, doubling with each further failure up to MAX_BACKOFF_S; a success forgets its failures, and failures
older than FORGET_S are forgotten. This is fail2ban's rule inside the server, so a guesser gets five tries per
address and then one try per backoff, and a right password from a throttled address waits like a wrong one (it
would otherwise tell the guesser which one was right).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anyio import CapacityLimiter

logger = logging.getLogger(__name__)

SCRYPT_AT_ONCE = 2
FREE_FAILURES = 5
BACKOFF_S = 30.0
MAX_BACKOFF_S = 900.0
FORGET_S = 3600.0
TRACKED_ADDRESSES = 10_000
LOGIN_ROUTES = ("/login", "/login/")
LOGIN_FULL_MESSAGE = (
    "This login already holds as many connections as one client may (PER_CLIENT_CONNECTIONS). "
    "Close some (other tabs, streams or uploads) and retry."
)


def throttled_message(retry_after_s: int) -> str:
    return f"Too many failed logins from this address. Try again in {retry_after_s} s."


@dataclass
class _Failures:
    count: int
    last: float


class FailedLogins:
    """Failed logins per address, thread-safe (Gradio's and the API's checks run on worker threads)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_address: OrderedDict[str, _Failures] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, address: str | None) -> int | None:
        """Seconds this address must wait before its next check, or None when it may try now."""
        if address is None:
            return None
        with self._lock:
            entry = self._current(address)
            if entry is None or entry.count < FREE_FAILURES:
                return None
            wait = entry.last + min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (entry.count - FREE_FAILURES)) - self._clock()
        return math.ceil(wait) if wait > 0 else None

    def failed(self, address: str | None) -> None:
        if address is None:
            return
        with self._lock:
            entry = self._current(address) or _Failures(0, 0.0)
            entry.count, entry.last = entry.count + 1, self._clock()
            self._by_address[address] = entry
            self._by_address.move_to_end(address)
            while len(self._by_address) > TRACKED_ADDRESSES:
                self._by_address.popitem(last=False)

    def succeeded(self, address: str | None) -> None:
        with self._lock:
            self._by_address.pop(address or "", None)

    def _current(self, address: str) -> _Failures | None:
        entry = self._by_address.get(address)
        if entry is not None and self._clock() - entry.last > FORGET_S:
            del self._by_address[address]
            return None
        return entry


class LoginGuard:
    """The one place a name and password are checked, for the pages (Gradio's auth) and the API (BearerCheck),
    and the one record of which credential (a page session's cookie, an API key) belongs to which login name."""

    def __init__(self, check: Callable[[str, str], bool]) -> None:
        self.check = check
        self.failures = FailedLogins()
        self._limiter: CapacityLimiter | None = None  # made on the event loop that first needs it
        self._names: OrderedDict[str, str] = OrderedDict()  # credential key -> the login name it proved
        self._names_lock = threading.Lock()

    def remember(self, credential: str, name: str) -> None:
        """A credential that passed the check ("cookie:<token>" or "bearer:<sha256>"), for LoginBudget."""
        with self._names_lock:
            self._names[credential] = name
            self._names.move_to_end(credential)
            while len(self._names) > TRACKED_ADDRESSES:
                self._names.popitem(last=False)

    def name_of(self, headers) -> str | None:
        """The login name a request's verified credential belongs to; None for none or an unverified one."""
        found = None
        for key, value in headers:
            if key == b"authorization":  # read as BearerCheck reads it (Starlette decodes headers as Latin-1)
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    digest = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).hexdigest()
                    found = found or f"bearer:{digest}"
            elif key == b"cookie":
                for part in value.decode("latin-1").split(";"):
                    cookie, _, token = part.strip().partition("=")
                    if cookie.startswith("access-token") and token:
                        found = found or f"cookie:{token}"
        if found is None:
            return None
        with self._names_lock:
            return self._names.get(found)

    async def verify(self, name: str, password: str) -> bool:
        """scrypt in a worker thread, SCRYPT_AT_ONCE at most at a time in the whole server."""
        import anyio

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(SCRYPT_AT_ONCE)
        return bool(await anyio.to_thread.run_sync(self.check, name, password, limiter=self._limiter))

    async def gradio_auth(self, name: str, password: str) -> bool:
        """What Gradio's /login calls (a coroutine function, so Gradio awaits it instead of running it on its
        loop); the address's throttling is LoginThrottle's, around the route."""
        return await self.verify(name, password)


class LoginThrottle:
    """ASGI middleware around Gradio's POST /login: a throttled address gets 429 with Retry-After before any check;
    the route's answer (200, or 400 "Incorrect credentials") is recorded against the address."""

    def __init__(self, app, guard: LoginGuard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in LOGIN_ROUTES:
            return await self.app(scope, receive, send)
        address = (scope.get("client") or (None,))[0]
        wait = self.guard.failures.retry_after(address)
        if wait is not None:
            logger.warning("refused a login from a throttled address")
            body = json.dumps({"detail": throttled_message(wait)}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", str(wait).encode()),
                    ],
                }
            )
            return await send({"type": "http.response.body", "body": body})

        form = bytearray()

        async def read_form():
            message = await receive()
            if message["type"] == "http.request" and len(form) < 1 << 16:
                form.extend(message.get("body", b"")[: (1 << 16) - len(form)])
            return message

        async def recorded(message) -> None:
            if message["type"] == "http.response.start":
                if message["status"] == 200:
                    self.guard.failures.succeeded(address)
                    self._remember_session(bytes(form), message.get("headers", []))
                elif message["status"] in (400, 401):
                    self.guard.failures.failed(address)
                    logger.warning("UI login refused")
            await send(message)

        await self.app(scope, read_form, recorded)

    def _remember_session(self, form: bytes, headers) -> None:
        """The session cookie Gradio set for the name that logged in (its form's username, as Gradio strips it)."""
        from urllib.parse import parse_qs

        names = parse_qs(form.decode("utf-8", "replace")).get("username") or [""]
        for key, value in headers:
            if key.lower() == b"set-cookie":
                cookie, _, rest = value.decode("latin-1").partition("=")
                if cookie.startswith("access-token") and names[0].strip():
                    self.guard.remember(f"cookie:{rest.split(';', 1)[0]}", names[0].strip())


class LoginBudget:
    """Requests in flight per login name, on top of the budget per address: one user on many addresses (or a
    stolen key) holds at most `per_login` of them. A credential counts once the check has passed for it, so a
    wrong key cannot spend another user's budget. The probes are never counted."""

    def __init__(self, app, guard: LoginGuard, per_login: int) -> None:
        self.app, self.guard, self.per_login = app, guard, per_login
        self._open: dict[str, int] = {}

    async def __call__(self, scope, receive, send) -> None:
        from medgemma_xray.web.connection_budget import PROBE_PATHS, over_budget_app

        if scope["type"] != "http" or scope.get("path") in PROBE_PATHS:
            return await self.app(scope, receive, send)
        name = self.guard.name_of(scope.get("headers") or [])
        if name is None:
            return await self.app(scope, receive, send)
        if self._open.get(name, 0) >= self.per_login:
            logger.warning("refused a request: its login holds its share of connections")
            return await over_budget_app(self.app, LOGIN_FULL_MESSAGE)(scope, receive, send)
        self._open[name] = self._open.get(name, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._open[name] -= 1
            if self._open[name] <= 0:
                del self._open[name]
