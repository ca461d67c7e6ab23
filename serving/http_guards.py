"""ASGI middleware in front of Gradio: file references checked against the upload folder, and a polite "busy".

Gradio itself refuses, in preprocessing, a file input that was not uploaded, but only once the Blocks count as
launched (the server sets that; see http_server.build_http_app). Its refusal is an exception: a traceback in the
console log, and either the server path in the answer (show_error on) or a bare "Error" (off). This guard applies
the same rule (Gradio's is_allowed_file, with the upload folder as the only created path) before the request
reaches Gradio, so a client-named path gets one fixed answer and one log line, whatever the path: an existing file,
a missing one, /etc/shadow or the control token are indistinguishable.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from serving.upload_cache import FORGED_PATH_MESSAGE

logger = logging.getLogger(__name__)

MAX_JSON_BODY = 2 << 20  # questions are bounded far below this; a bigger JSON body is not a request we serve
BUSY_MESSAGE = "The server is busy: every place in the queue is taken. Please retry in a minute."
RETRY_AFTER_S = 60


def file_paths(value) -> list:
    """Every 'path' named in a request's JSON (Gradio's FileData), however deeply nested."""
    found, pending = [], [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if "path" in item:
                found.append(item["path"])
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found


async def _answer(send, status: int, payload: dict, headers: tuple = ()) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class FileReferenceGuard:
    """Refuse any Gradio API call whose data names a file outside the upload folder."""

    def __init__(self, app, upload_folder: Path) -> None:
        self.app = app
        self.upload_folder = str(Path(upload_folder).resolve())

    def _uploaded(self, path) -> bool:
        from gradio.utils import is_allowed_file

        if not isinstance(path, str) or not path or "://" in path:
            return False
        try:
            resolved = Path(path).resolve()
        except (OSError, ValueError, RuntimeError):
            return False
        allowed, _reason = is_allowed_file(
            resolved, blocked_paths=[], allowed_paths=[], created_paths=[self.upload_folder]
        )
        return allowed and str(resolved) != self.upload_folder

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not path.startswith("/gradio_api/")
            or path.startswith("/gradio_api/upload")
        ):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_JSON_BODY:
                return await _answer(send, 413, {"detail": "The request is too large."})
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            payload = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError):
            payload = None  # Gradio answers malformed JSON itself
        if any(not self._uploaded(named) for named in file_paths(payload)):
            logger.warning("refused a call naming a file that was not uploaded (route %s)", _route_name(path))
            return await _answer(send, 403, {"detail": FORGED_PATH_MESSAGE})

        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _route_name(path: str) -> str:
    """The route family only (/gradio_api/call, /gradio_api/queue): logs carry no text the client chose."""
    return "/".join(path.split("/")[:3])[:40]


class PoliteBusyQueue:
    """Gradio answers a full queue with 503 and "Queue is full. Max size is N and size is N."; say instead what
    the user should do, with a Retry-After header."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/gradio_api/"):
            return await self.app(scope, receive, send)
        held: dict = {}

        async def send_politely(message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                held["start"], held["body"] = message, b""
                return
            if "start" not in held or message["type"] != "http.response.body":
                return await send(message)
            held["body"] += message.get("body", b"")
            if message.get("more_body"):
                return
            if b"Queue is full" in held["body"]:
                return await _answer(
                    send, 503, {"detail": BUSY_MESSAGE}, ((b"retry-after", str(RETRY_AFTER_S).encode()),)
                )
            await send(held["start"])
            await send({"type": "http.response.body", "body": held["body"]})

        await self.app(scope, receive, send_politely)
