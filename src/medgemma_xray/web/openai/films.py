"""The film of an API request: a base64 data: URL in, the model's image out, decoded once per content.

An OpenAI client resends the film with every request of a conversation, and a class sends one film many times.
Decoding it (base64, PNG or DICOM, the film check, padding, hashing) is what made the API slower than the UI, which
decodes once at upload. So films are kept by a hash of the data: URL's payload, a payload being decoded is shared
by every request that carries it (10 requests at once decode it once), and decodes run in worker threads, at most
FILM_DECODES_AT_ONCE at a time: never on the event loop or the scheduler's thread, and never 40 full-size films in
memory at once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from medgemma_xray.web.openai.errors import ApiError, bad_request

if TYPE_CHECKING:
    from anyio import CapacityLimiter

logger = logging.getLogger(__name__)

FILM_DECODES_AT_ONCE = 2
FILM_CACHE_BYTES = 256 << 20  # decoded films kept for clients that resend them (follow-ups, a class on one film)
REMOTE_SCHEMES = ("http", "https", "ftp", "file", "gs", "s3")
ACCEPTED_IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg", "application/dicom", "application/octet-stream")


@dataclass(frozen=True)
class Film:
    """The model's input image (shared between requests: read it, never change it), its warnings, and a hash of
    the image's content (the backend's cache key)."""

    image: Any  # PIL.Image.Image
    warnings: tuple[str, ...]
    image_hash: str

    @property
    def nbytes(self) -> int:
        return self.image.width * self.image.height * len(self.image.getbands())


def data_url_payload(url: str, max_bytes: int) -> str:
    """The base64 payload of a data: URL, checked for what can be checked without decoding it. The server
    fetches nothing: every other scheme is refused."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in REMOTE_SCHEMES:
        raise bad_request(
            f"Remote image URLs ({scheme}://) are refused: this server fetches nothing. Send the film inline as a "
            "data: URL, e.g. data:application/dicom;base64,<the file in base64>.",
            param="messages",
            code="remote_image_url_refused",
        )
    header, comma, payload = url.partition(",")
    if scheme != "data" or not comma:
        raise bad_request(
            "image_url.url must be a data: URL (data:image/png;base64,..., data:image/jpeg;base64,... or "
            "data:application/dicom;base64,...).",
            param="messages",
            code="invalid_image_url",
        )
    parts = [part.strip().lower() for part in header[len("data:") :].split(";")]
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
    if len(payload) > (max_bytes // 3 + 1) * 4 + 4:
        raise too_large(max_bytes)
    return payload


def too_large(max_bytes: int) -> ApiError:
    return bad_request(
        f"The film is larger than this server's {max_bytes / 2**20:g} MiB limit (MAX_FILE_SIZE_MB). Export a single "
        "film at a lower size.",
        param="messages",
        code="image_too_large",
    )


def base64_bytes(payload: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            "The data: URL's base64 payload is damaged; encode the file again.", "messages", "invalid_image_url"
        ) from None


class DecodedFilms:
    """Films by payload hash, least recently used first out, bounded by the decoded images' bytes."""

    def __init__(self, max_bytes: int = FILM_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._films: OrderedDict[str, Film] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> Film | None:
        with self._lock:
            film = self._films.get(key)
            if film is not None:
                self._films.move_to_end(key)
            return film

    def put(self, key: str, film: Film) -> None:
        if film.nbytes > self.max_bytes:
            return
        with self._lock:
            if key in self._films:
                return
            self._films[key] = film
            self._bytes += film.nbytes
            while self._bytes > self.max_bytes:
                _, oldest = self._films.popitem(last=False)
                self._bytes -= oldest.nbytes


class FilmReader:
    """data: URL -> Film, for the API. load(bytes) -> Film is the film intake; it raises ApiError for a bad film."""

    def __init__(
        self,
        load: Callable[[bytes], Film],
        max_bytes: int,
        cache: DecodedFilms | None = None,
        decodes_at_once: int = FILM_DECODES_AT_ONCE,
    ) -> None:
        self.load, self.max_bytes = load, max_bytes
        self.cache = cache if cache is not None else DecodedFilms()
        self.decodes = 0  # films decoded, not taken from the cache or from a decode already running
        self._count_lock = threading.Lock()
        self._decodes_at_once = decodes_at_once
        self._limiter: CapacityLimiter | None = None  # made on the event loop
        self._running: dict[str, asyncio.Task] = {}  # touched only on the event loop

    @property
    def waiting_decodes(self) -> int:
        """Films waiting for a decode to finish before theirs starts."""
        return self._limiter.statistics().tasks_waiting if self._limiter is not None else 0

    async def read(self, url: str) -> Film:
        import anyio

        payload = data_url_payload(url, self.max_bytes)
        key = await anyio.to_thread.run_sync(_payload_key, payload)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        task = self._running.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._decode(key, payload))
            task.add_done_callback(_retrieve)
            self._running[key] = task
        return await asyncio.shield(task)  # a client that leaves does not cancel the others' decode

    async def _decode(self, key: str, payload: str) -> Film:
        import anyio

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._decodes_at_once)
        try:
            film = await anyio.to_thread.run_sync(self._decode_in_thread, payload, limiter=self._limiter)
        finally:
            del self._running[key]
        self.cache.put(key, film)
        return film

    def _decode_in_thread(self, payload: str) -> Film:
        data = base64_bytes(payload)
        if len(data) > self.max_bytes:
            raise too_large(self.max_bytes)
        with self._count_lock:
            self.decodes += 1
        return self.load(data)


def _payload_key(payload: str) -> str:
    return hashlib.sha256(payload.encode("ascii", "replace")).hexdigest()


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # read here, so a failure nobody awaited any more is not logged as never retrieved


def film_loader(settings) -> Callable[[bytes], Film]:
    """bytes -> Film under the UI's limits and film check (refuse or warn, as FILM_CHECK says)."""
    reference = None
    if settings.film_check != "off":
        from medgemma_xray.film_check import load_reference
        from medgemma_xray.film_check.check import REFERENCE_PATH

        reference = load_reference(settings.film_check_reference or REFERENCE_PATH)

    def load(data: bytes) -> Film:
        from medgemma_xray.film_check import check_film
        from medgemma_xray.xray_io import ImageInputError, load_radiograph
        from medgemma_xray.xray_io.preprocess import model_input_image

        try:
            film = load_radiograph(data, max_pixels=settings.max_pixels, max_bytes=settings.max_file_size_bytes)
        except ImageInputError as exc:
            logger.warning("refused a film: %s", type(exc).__name__)
            too_big = type(exc).__name__ == "ImageTooLargeError"
            raise bad_request(str(exc), "messages", "image_too_large" if too_big else "invalid_image") from None
        image = model_input_image(film)
        warnings = tuple(film.warnings)
        if reference is not None:  # the same check as the UI's upload: the model reads only chest films
            verdict = check_film(film.pixels, reference)
            if not verdict.plausible and settings.film_check == "refuse":
                logger.warning("refused a film: NotAChestFilmError")
                raise bad_request(verdict.refusal(), "messages", "not_a_chest_film")
            if not verdict.plausible:
                warnings += (verdict.warning(),)
        return Film(image, warnings, hashlib.sha256(image.tobytes()).hexdigest())

    return load
