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
from dataclasses import dataclass
from pathlib import Path

from medgemma_xray.web.upload_cache import FORGED_PATH_MESSAGE

logger = logging.getLogger(__name__)

MAX_JSON_BODY = 2 << 20  # questions are bounded far below this; a bigger JSON body is not a request we serve
MAX_JSON_DEPTH = 32  # Gradio's calls nest a handful of levels (data list, FileData, meta)
TOO_DEEP_MESSAGE = "The request's JSON is nested too deeply to be a call of this app."
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


async def answer_json(send, status: int, payload, headers: tuple = ()) -> None:
    """A whole JSON response from ASGI middleware (every guard of this edge answers this way)."""
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

    def __init__(self, app, upload_folder: Path, calls: CallShapes | None = None) -> None:
        self.app = app
        self.upload_folder = str(Path(upload_folder).resolve())
        self.calls = calls

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
                return await answer_json(send, 413, {"detail": "The request is too large."})
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            payload = json.loads(body) if body else None
        except RecursionError:  # JSON nested 100,000 deep: Python's parser gives up with a traceback
            logger.warning("refused a call whose JSON is nested too deeply (route %s)", _route_name(path))
            return await answer_json(send, 400, {"detail": TOO_DEEP_MESSAGE})
        except (ValueError, UnicodeDecodeError):
            payload = None  # Gradio answers malformed JSON itself
        if payload is not None and _depth_exceeds(payload, MAX_JSON_DEPTH):
            logger.warning("refused a call whose JSON is nested too deeply (route %s)", _route_name(path))
            return await answer_json(send, 400, {"detail": TOO_DEEP_MESSAGE})
        problem = self.calls.problem(path, payload) if self.calls is not None else None
        if problem is not None:
            logger.warning("refused a malformed call (route %s): %s", _route_name(path), problem.kind)
            return await answer_json(send, 400, {"detail": problem.message})
        if any(not self._uploaded(named) for named in file_paths(payload)):
            logger.warning("refused a call naming a file that was not uploaded (route %s)", _route_name(path))
            return await answer_json(send, 403, {"detail": FORGED_PATH_MESSAGE})

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
                return await answer_json(
                    send, 503, {"detail": BUSY_MESSAGE}, ((b"retry-after", str(RETRY_AFTER_S).encode()),)
                )
            await send(held["start"])
            await send({"type": "http.response.body", "body": held["body"]})

        await self.app(scope, receive, send_politely)


def _depth_exceeds(value, limit: int) -> bool:
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
    return False


@dataclass(frozen=True)
class CallProblem:
    kind: str  # for the log: a fixed word, nothing the client sent
    message: str  # for the client


class CallShapes:
    """What each of the UI's events accepts, read from the Blocks: its fn_index and api_name, and which inputs are
    files. A call naming an event that does not exist, or sending a bare string where a file (FileData) belongs,
    is refused here with 400: Gradio answered both with HTTP 500 and a traceback, the string quoted in the log."""

    def __init__(self, demo) -> None:
        from gradio.data_classes import FileData, ListFiles

        self.file_inputs: dict[int, list[bool]] = {}
        self.by_api_name: dict[str, int] = {}
        for index, fn in demo.fns.items():
            flags = []
            for component in fn.inputs:
                model = getattr(component, "data_model", None)
                flags.append(isinstance(model, type) and issubclass(model, (FileData, ListFiles)))
            self.file_inputs[index] = flags
            if isinstance(fn.api_name, str):
                self.by_api_name[fn.api_name.lstrip("/")] = index

    def problem(self, path: str, payload) -> CallProblem | None:
        if not isinstance(payload, dict):
            return None
        index = None
        if "fn_index" in payload:
            index = payload["fn_index"]
            if not isinstance(index, int) or isinstance(index, bool) or index not in self.file_inputs:
                return CallProblem("unknown fn_index", "The call names no event of this app (unknown fn_index).")
        else:
            for prefix in ("/gradio_api/call/", "/gradio_api/run/", "/gradio_api/api/"):
                if path.startswith(prefix):
                    index = self.by_api_name.get(path[len(prefix) :].strip("/").split("/")[0])
        data = payload.get("data")
        if index is None or not isinstance(data, list):
            return None
        for is_file, value in zip(self.file_inputs[index], data, strict=False):
            if is_file and not (value is None or isinstance(value, dict) or _all_dicts(value)):
                return CallProblem(
                    "file input not FileData",
                    'A file input must be a FileData object ({"path": ..., "meta": {"_type": '
                    '"gradio.FileData"}}) naming a file sent to /gradio_api/upload first, not a bare string.',
                )
        return None


def _all_dicts(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


# Routes this app never needs. process_recording turns a client's audio into a file per call (in /tmp, kept);
# deep_link dumps any session's components to whoever knows its session hash.
BLOCKED_ROUTES = ("/gradio_api/process_recording", "/gradio_api/deep_link")
# Gradio's deprecated second file route serves what /gradio_api/file= serves; every URL this app hands out uses
# file=, so the old form is closed rather than guarded twice (it passed by the owner and upload checks).
BLOCKED_PREFIXES = ("/gradio_api/file/",)
UPLOAD_ROUTE = "/gradio_api/upload"
FILE_ROUTE = "/gradio_api/file="


class RouteGuard:
    """Routes Gradio serves that this app does not need, and limits on the upload route.

    - Blocked routes answer 404, and so does Gradio's deprecated /gradio_api/file/<path> form of the file route.
    - An upload is never served back (GET /gradio_api/file=<an upload>): Gradio serves it inline under the
      uploader's file name, which may be a patient's. Previews and report exports (the server's own files, under
      unguessable names) are still served.
    - The upload route is served by medgemma_xray.web.upload_route (one multipart parse that counts, reserves and
      stores), not by Gradio's.
    """

    def __init__(self, app, ledger, upload) -> None:
        self.app = app
        self.ledger = ledger
        self.upload = upload

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if any(path.rstrip("/") == route for route in BLOCKED_ROUTES) or path.startswith(BLOCKED_PREFIXES):
            return await answer_json(send, 404, {"detail": "Not Found"})
        # scope["path"] is already percent-decoded (uvicorn), as Gradio's route reads it: decoded again, a name
        # with "%41" in it would be looked up as another file and served back
        if path.startswith(FILE_ROUTE) and self.ledger.is_upload(path[len(FILE_ROUTE) :]):
            return await answer_json(send, 404, {"detail": "Not Found"})
        if path.rstrip("/") == UPLOAD_ROUTE and scope.get("method") == "POST":
            return await self.upload(scope, receive, send, gradio=self.app)
        return await self.app(scope, receive, send)
