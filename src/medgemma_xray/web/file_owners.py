"""Previews and exports served only to the client they were made for.

Gradio serves any file of its cache at /gradio_api/file=<path> to whoever asks: the names are unguessable, but a
URL that leaks (a shared screen, a proxy log, the browser history of a shared workstation) hands another person a
film's preview or a session's export. Here each client gets a random cookie (HttpOnly, SameSite=Lax) on its first
response; every file path that the pages' answers (the event streams and JSON replies of /gradio_api/) hand to a
client is recorded as that client's; and a file recorded for other clients only is answered 404. The browser sends
the cookie with its image and download requests, and gradio_client keeps the cookie it receives with the page's
config, so both fetch their own files as before. A client that keeps no cookie is known by its address instead.
A file two clients were both given (the same film uploaded by both) is served to both. Files no answer named
(Gradio's own assets) are served as before.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from pathlib import Path

COOKIE = "medgemma_client"
FILE_ROUTE = "/gradio_api/file="
MAX_FILES = 100_000  # recorded paths kept (least recently recorded go first)
_PATH = re.compile(rb'"path":\s*"((?:[^"\\]|\\.){1,4096})"')
_CARRY = 8192  # bytes of one body chunk kept for the next, so a path split between chunks is still seen


class FileOwners:
    """Which clients were given each file of the cache. Thread-safe."""

    def __init__(self, folder: Path, max_age_s: float) -> None:
        self.folder = str(Path(folder).resolve())
        self.max_age_s = max_age_s
        self._owners: OrderedDict[str, tuple[float, set[str]]] = OrderedDict()
        self._lock = threading.Lock()

    def give(self, path: str, owner: str) -> None:
        resolved = _resolved(path)
        if resolved is None or not resolved.startswith(self.folder + "/"):
            return
        with self._lock:
            _, owners = self._owners.pop(resolved, (0.0, set()))
            owners.add(owner)
            self._owners[resolved] = (time.monotonic(), owners)
            while len(self._owners) > MAX_FILES:
                self._owners.popitem(last=False)

    def may_fetch(self, path: str, owner: str) -> bool:
        resolved = _resolved(path)
        if resolved is None:
            return True  # Gradio answers a path it cannot resolve itself
        with self._lock:
            entry = self._owners.get(resolved)
            if entry is None:
                return True
            if time.monotonic() - entry[0] > 2 * self.max_age_s:  # Gradio has deleted it by now
                del self._owners[resolved]
                return True
            return owner in entry[1]


class FileOwnerGuard:
    """ASGI middleware: the client cookie, files recorded as they are handed out, other clients' files refused."""

    def __init__(self, app, owners: FileOwners) -> None:
        self.app = app
        self.owners = owners

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cookie = _cookie(scope)
        owner = f"cookie:{cookie}" if cookie else f"address:{(scope.get('client') or ('?', 0))[0]}"
        path = scope.get("path", "")
        # scope["path"] is already percent-decoded (uvicorn), as Gradio's route reads it: never decode it again
        if path.startswith(FILE_ROUTE) and not self.owners.may_fetch(path[len(FILE_ROUTE) :], owner):
            return await _not_found(send)
        new_cookie = None if cookie else secrets.token_urlsafe(24)
        watch = path.startswith("/gradio_api/") and not path.startswith(FILE_ROUTE)
        carry = b""

        async def watched_send(message) -> None:
            nonlocal carry
            if message["type"] == "http.response.start" and new_cookie is not None:
                value = f"{COOKIE}={new_cookie}; Path=/; HttpOnly; SameSite=Lax"
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", value.encode())]}
            elif message["type"] == "http.response.body" and watch:
                body = carry + message.get("body", b"")
                for found in _PATH.finditer(body):
                    self._give(found.group(1), owner)
                carry = body[-_CARRY:]
            await send(message)

        await self.app(scope, receive, watched_send)

    def _give(self, quoted: bytes, owner: str) -> None:
        try:
            path = json.loads(b'"' + quoted + b'"')
        except ValueError:
            return
        if isinstance(path, str):
            self.owners.give(path, owner)


def _cookie(scope) -> str | None:
    for name, value in scope.get("headers") or []:
        if name != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key, _, found = part.strip().partition("=")
            if key == COOKIE and 16 <= len(found) <= 64:
                return found
    return None


def _resolved(path: str) -> str | None:
    try:
        return str(Path(path).resolve())
    except (OSError, ValueError, RuntimeError):
        return None


async def _not_found(send) -> None:
    body = b'{"detail": "Not Found"}'
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
