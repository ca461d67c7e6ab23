"""The upload route (POST /gradio_api/upload), served here instead of by Gradio: one multipart parse that counts
the files, reserves their bytes and stores them.

Two parsers of one body, one counting files and one storing them, can read it differently (`boundary=decoy;
boundary=real`: one takes the first parameter, the other the last), and a request then carries 40 files past a
limit of 4. So the one parser that stores the files is the one that counts them
(Gradio's own GradioMultiPartParser, given this server's limits), and every chunk's bytes are reserved in the upload
ledger, atomically, before they are written: concurrent requests cannot together pass UPLOAD_CACHE_MAX_MB. A
request refused part-way (too many files, a file too large, the quota, a broken body, a client that went away)
leaves nothing on disk. Stored files are named as Gradio names them (<cache>/<sha256>/<name>), recorded in the
ledger (deleted after UPLOAD_MAX_AGE_S unless read first) and in the Blocks' upload set, as Gradio's route does.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medgemma_xray.web.http_guards import answer_json

if TYPE_CHECKING:
    from medgemma_xray.web.upload_cache import UploadLedger

logger = logging.getLogger(__name__)

UPLOAD_FULL_MESSAGE = "The server's upload space is full. Try again in a minute."
MAX_FIELDS = 4  # form fields that are not files (the UI sends none)
MAX_FIELD_BYTES = 4 << 10  # one such field's value, kept in memory


class UploadRefused(Exception):
    """An upload this route will not store: the HTTP status and the message for the client."""

    def __init__(self, status: int, message: str, headers: tuple = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class UploadRoute:
    """An ASGI endpoint for POST /gradio_api/upload."""

    def __init__(
        self, folder: Path, ledger: UploadLedger, max_files: int, max_file_bytes: int, uploaded: set | None = None
    ) -> None:
        self.folder = Path(folder)
        self.ledger = ledger
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes
        self.uploaded = uploaded if uploaded is not None else set()  # the Blocks' upload_file_set

    async def __call__(self, scope, receive, send, gradio=None) -> None:
        """gradio: the app below (Gradio's routes), asked whether the client is logged in, as its own upload route
        asks before it reads a byte."""
        from python_multipart.multipart import parse_options_header
        from starlette.requests import ClientDisconnect, Request

        if gradio is not None:
            status, body = await _login_check(gradio, scope)
            if status != 200:
                return await _answer_raw(send, status, body)
        request = Request(scope, receive)
        kind, options = parse_options_header(request.headers.get("content-type", ""))
        if kind != b"multipart/form-data" or not options.get(b"boundary"):
            return await _answer(send, 400, "An upload is a multipart/form-data body with a boundary.")
        declared = _declared_length(request.headers.get("content-length"))
        if declared is not None and not self.ledger.has_room_for(min(declared, self.max_files * self.max_file_bytes)):
            logger.warning("refused an upload: the upload cache is at its quota")
            return await _answer(send, 507, UPLOAD_FULL_MESSAGE, ((b"retry-after", b"60"),))
        parser = _make_parser(self, request)
        try:
            form = await parser.parse()
            stored = self._place(form)
        except UploadRefused as refused:
            parser.discard()
            logger.warning("refused an upload: %s", refused.status)
            return await _answer(send, refused.status, refused.message, refused.headers)
        except ClientDisconnect:
            parser.discard()
            return None
        except Exception as exc:
            parser.discard()
            from starlette.formparsers import MultiPartException

            if not isinstance(exc, MultiPartException):
                raise
            too_large = "maximum allowed size" in exc.message
            logger.warning("refused an upload: %s", "a file over the size limit" if too_large else "a malformed body")
            if too_large:
                return await _answer(send, 413, f"A file is larger than the {self.max_file_bytes >> 20} MiB limit.")
            return await _answer(send, 400, "The upload's multipart body is malformed; send it again.")
        self.ledger.record([str(path) for path in stored], reserved=parser.reserved)
        parser.reserved = 0
        self.uploaded.update(str(path) for path in stored)
        return await answer_json(send, 200, [str(path) for path in stored])

    def _place(self, form) -> list[Path]:
        """Each file under <folder>/<sha256>/<name>, as Gradio's own route stores it."""
        from gradio import utils
        from gradio.data_classes import DeveloperPath, UserProvidedPath
        from gradio.exceptions import InvalidPathError
        from gradio_client import utils as client_utils

        stored: list[Path] = []
        for item in form.getlist("files"):
            if isinstance(item, str):
                continue
            name = client_utils.strip_invalid_filename_characters(Path(item.filename or "").name) or "upload"
            directory = self.folder / item.sha.hexdigest()
            directory.mkdir(exist_ok=True, parents=True)
            try:
                destination = Path(utils.safe_join(DeveloperPath(str(directory)), UserProvidedPath(name)))
            except InvalidPathError:
                raise UploadRefused(400, "A file name in the upload is not a plain file name.") from None
            item.file.close()
            os.replace(item.file.name, destination)
            stored.append(destination)
        return stored


def _make_parser(route: UploadRoute, request) -> Any:
    """Gradio's multipart parser with this server's limits: the files it counts are the files it writes, and every
    chunk is reserved in the ledger before it is written."""
    from gradio.route_utils import GradioMultiPartParser
    from gradio.routes import file_upload_statuses

    class CountingParser(GradioMultiPartParser):
        reserved = 0

        def on_headers_finished(self) -> None:
            try:
                super().on_headers_finished()
            except Exception as exc:
                if "Too many files" in str(exc):
                    raise UploadRefused(
                        413, f"One upload may carry at most {route.max_files} files; send fewer at a time."
                    ) from None
                if "Too many fields" in str(exc):
                    raise UploadRefused(400, "The upload carries form fields this server does not take.") from None
                raise

        def on_part_data(self, data: bytes, start: int, end: int) -> None:
            size = end - start
            if self._current_part.file is None:
                if len(self._current_part.data) + size > MAX_FIELD_BYTES:
                    raise UploadRefused(400, "A form field in the upload is too long.")
            elif not route.ledger.reserve(size):
                raise UploadRefused(507, UPLOAD_FULL_MESSAGE, ((b"retry-after", b"60"),))
            else:
                self.reserved += size
            super().on_part_data(data, start, end)

        def discard(self) -> None:
            """Delete every file this request wrote and give back its reservation."""
            for temporary in self._files_to_close_on_error:
                with contextlib.suppress(OSError):
                    temporary.close()
                with contextlib.suppress(OSError):
                    os.unlink(temporary.name)
            route.ledger.release(self.reserved)
            self.reserved = 0

    upload_id = request.query_params.get("upload_id")
    return CountingParser(
        request.headers,
        request.stream(),
        max_files=route.max_files,
        max_fields=MAX_FIELDS,
        upload_dir=str(route.folder),
        max_file_size=route.max_file_bytes,
        upload_id=upload_id,
        upload_progress=file_upload_statuses if upload_id else None,
    )


async def _login_check(app, scope) -> tuple[int, bytes]:
    """Gradio's own answer to GET /gradio_api/login_check for this client (its cookies): 200 when no login is
    needed or the client is logged in, else 401 with Gradio's body."""
    path = "/gradio_api/login_check"
    probe = {**scope, "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b""}
    answer: dict[str, Any] = {"status": 500, "body": b""}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app(probe, receive, send)
    return int(answer["status"]), bytes(answer["body"])


async def _answer_raw(send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _declared_length(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


async def _answer(send, status: int, message: str, headers: tuple = ()) -> None:
    await answer_json(send, status, {"detail": message}, headers)
