"""The film of an API request: a base64 data: URL in, the intake's film out, decoded once per content.

An OpenAI client resends the film with every request of a conversation, and a class sends one film many times.
Decoding it (base64, PNG or DICOM, the film check, padding, hashing) is what made the API slower than the UI, which
decodes once at upload. The server's one film intake (medgemma_xray.intake) keeps decoded films by the hash of
their bytes and bounds the decodes running at once (FILM_DECODES). In front of it, this reader remembers which
film a data: URL was, so a resent film skips even the base64 decode and the hash of its bytes, and a URL being
read is shared by every request that carries it (10 requests at once read it once). Reads run on worker threads,
never on the event loop or the scheduler's thread, at most as many at once as the intake decodes, and hashes at
most HASHES_AT_ONCE: the rest wait as tasks, not as threads each holding a copy of its film.

Every refusal is a 400 (an input error, whatever its size), with the intake's code: not_an_image,
not_a_chest_film or image_too_large.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING

from medgemma_xray.web.asking import log_refusal
from medgemma_xray.web.openai.errors import ApiError, bad_request

if TYPE_CHECKING:
    from anyio import CapacityLimiter

    from medgemma_xray.intake import FilmIntake, IntakeFilm

HASHES_AT_ONCE = 4
URLS_REMEMBERED = 4096  # URL hash -> film key: 64-character strings, a few hundred kB at most
REMOTE_SCHEMES = ("http", "https", "ftp", "file", "gs", "s3")
ACCEPTED_IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg", "application/dicom", "application/octet-stream")


def payload_start(url: str, max_bytes: int) -> int:
    """Where the base64 payload of a data: URL starts, once its header is checked; nothing of the payload is
    copied (it can be tens of MB, and forty requests may carry one at once). The server fetches nothing: every
    other scheme is refused."""
    colon, comma = url.find(":", 0, 16), url.find(",", 0, 256)
    scheme = url[:colon].lower() if colon > 0 else ""
    if scheme in REMOTE_SCHEMES:
        raise bad_request(
            f"Remote image URLs ({scheme}://) are refused: this server fetches nothing. Send the film inline as a "
            "data: URL, e.g. data:application/dicom;base64,<the file in base64>.",
            param="messages",
            code="remote_image_url_refused",
        )
    if scheme != "data" or comma < 0:
        raise bad_request(
            "image_url.url must be a data: URL (data:image/png;base64,..., data:image/jpeg;base64,... or "
            "data:application/dicom;base64,...).",
            param="messages",
            code="invalid_image_url",
        )
    parts = [part.strip().lower() for part in url[colon + 1 : comma].split(";")]
    if "base64" not in parts[1:]:
        raise bad_request(
            "The data: URL must be base64-encoded (data:<type>;base64,...).", "messages", "invalid_image_url"
        )
    if parts[0] and parts[0] not in ACCEPTED_IMAGE_TYPES:
        raise bad_request(
            f"The data: URL declares {parts[0]!r}; send a chest film as image/png, image/jpeg or application/dicom.",
            param="messages",
            code="unsupported_image_type",
        )
    if len(url) - comma - 1 > (max_bytes // 3 + 1) * 4 + 4:
        raise too_large(max_bytes)
    return comma + 1


def too_large(max_bytes: int) -> ApiError:
    return bad_request(
        f"The film is larger than this server's {max_bytes / 2**20:g} MiB limit (MAX_FILE_SIZE_MB). Export a single "
        "film at its native resolution.",
        param="messages",
        code="image_too_large",
    )


def base64_bytes(url: str, start: int) -> bytes:
    try:
        return base64.b64decode(url[start:], validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            "The data: URL's base64 payload is damaged; encode the file again.", "messages", "invalid_image_url"
        ) from None


class FilmReader:
    """data: URL -> the intake's film, for the API. Touched only on the event loop (its reads run on threads)."""

    def __init__(self, intake: FilmIntake) -> None:
        self.intake = intake
        self.max_bytes = intake.config.max_bytes
        self._films_by_url: OrderedDict[str, str] = OrderedDict()
        self._running: dict[str, asyncio.Task] = {}
        self._limiter: CapacityLimiter | None = None  # reads at once; made on the event loop
        self._hashing: CapacityLimiter | None = None  # hashes at once (each holds a copy of its URL's bytes)

    async def read(self, url: str) -> IntakeFilm:
        import anyio

        start = payload_start(url, self.max_bytes)
        if self._hashing is None:
            self._hashing = anyio.CapacityLimiter(HASHES_AT_ONCE)
        key = await anyio.to_thread.run_sync(_url_key, url, limiter=self._hashing)
        film = self._remembered(key)
        if film is not None:
            return film
        task = self._running.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read(key, url, start))
            task.add_done_callback(_retrieve)
            self._running[key] = task
        return await asyncio.shield(task)  # a client that leaves does not cancel the others' read

    def _remembered(self, key: str) -> IntakeFilm | None:
        film_key = self._films_by_url.get(key)
        if film_key is None:
            return None
        self._films_by_url.move_to_end(key)
        return self.intake.cached(film_key)  # None once the intake's cache has let the film go

    async def _read(self, key: str, url: str, start: int) -> IntakeFilm:
        import anyio

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.intake.config.max_decodes)
        try:
            film = await anyio.to_thread.run_sync(self._read_in_thread, url, start, limiter=self._limiter)
        finally:
            del self._running[key]
        self._films_by_url[key] = film.key
        while len(self._films_by_url) > URLS_REMEMBERED:
            self._films_by_url.popitem(last=False)
        return film

    def _read_in_thread(self, url: str, start: int) -> IntakeFilm:
        from medgemma_xray.intake import FilmRefused

        data = base64_bytes(url, start)
        if len(data) > self.max_bytes:
            raise too_large(self.max_bytes)
        try:
            return self.intake.read(data)
        except FilmRefused as exc:
            log_refusal(exc, "API film")  # its class only: the message can quote the film's tags
            raise bad_request(str(exc), param="messages", code=exc.code) from None


def _url_key(url: str) -> str:
    """The hash of the whole data: URL (its header too: the same film declared otherwise is only a cache miss)."""
    return hashlib.sha256(url.encode("ascii", "replace")).hexdigest()


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # read here, so a failure nobody awaited any more is not logged as never retrieved
