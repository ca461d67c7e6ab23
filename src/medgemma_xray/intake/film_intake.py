"""Bytes in, the model's film out: one intake behind every door (main page, /teaching, the OpenAI API, the batch CLI,
the Ray ingress, the engine build's calibration reader).

As SGLang's tokenizer manager is the one place its doors validate and preprocess, this is the one place a film is
decoded (xray_io, with its size and bomb checks), checked as a frontal chest film (film_check, whose reference is
loaded once here), made into the model's input and hashed. What a door gets back is an IntakeFilm or one of three
errors (intake.errors). Decoded films are kept by the SHA-256 of their bytes in one budgeted cache, so a film sent
again (an API follow-up, a class on one case) is not decoded again, and concurrent reads of the same bytes decode
once. At most `max_decodes` decodes run at once in the whole process, whichever door asks: the rest wait their
turn, so forty requests carrying a 6000-px film cost two decodes' memory at a time, not forty. Each decode runs in
a worker process under `decode_timeout_s` (intake.decode_pool): a file that keeps a decoder busy past it is
refused, its worker killed, whatever the format.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medgemma_xray.film_check import FilmVerdict
from medgemma_xray.film_check.check import REFERENCE_PATH
from medgemma_xray.inference_api.shared_caches import image_content_hash
from medgemma_xray.intake.cache import SharedCache
from medgemma_xray.intake.decode_pool import DecodePool
from medgemma_xray.intake.decoding import DecodedFilm, DecodeTask, decode_film, reference_at
from medgemma_xray.intake.errors import FilmTooLarge, NotAChestFilm, NotAnImage, refusal_for
from medgemma_xray.xray_io import ImageInputError, Radiograph
from medgemma_xray.xray_io.loader import DEFAULT_MAX_PIXELS, MAX_UPLOAD_BYTES
from medgemma_xray.xray_io.values import FilmValues

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

FILM_CHECK_MODES = ("refuse", "warn", "off")
DEFAULT_CACHE_BYTES = 512 << 20
DEFAULT_MAX_DECODES = 2
DEFAULT_DECODE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class IntakeConfig:
    """What an intake enforces. film_check: refuse (NotAChestFilm), warn (read, with a warning) or off."""

    film_check: str = "refuse"
    film_check_reference: Path | None = None  # default: the reference fitted on the project's phantoms
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_bytes: int = MAX_UPLOAD_BYTES
    cache_bytes: int = DEFAULT_CACHE_BYTES  # 0: keep nothing (a batch run reads each film once)
    max_decodes: int = DEFAULT_MAX_DECODES
    decode_timeout_s: float = DEFAULT_DECODE_TIMEOUT_S  # each decode in a worker process, killed past this; 0: here

    def __post_init__(self) -> None:
        if self.film_check not in FILM_CHECK_MODES:
            raise ValueError(f"film_check must be one of {', '.join(FILM_CHECK_MODES)}, got {self.film_check!r}")
        if self.max_decodes < 1:
            raise ValueError(f"max_decodes must be at least 1, got {self.max_decodes}")
        if self.decode_timeout_s < 0:
            raise ValueError(f"decode_timeout_s must be 0 (off) or positive, got {self.decode_timeout_s}")

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> IntakeConfig:
        """From serving.settings.Settings (read by attribute: this layer sits below serving)."""
        values = dict(
            film_check=settings.film_check,
            film_check_reference=settings.film_check_reference,
            max_pixels=settings.max_pixels,
            max_bytes=settings.max_file_size_bytes,
            cache_bytes=int(getattr(settings, "film_cache_mb", DEFAULT_CACHE_BYTES >> 20)) << 20,
            max_decodes=int(getattr(settings, "film_decodes", DEFAULT_MAX_DECODES)),
            decode_timeout_s=float(getattr(settings, "film_decode_timeout_s", DEFAULT_DECODE_TIMEOUT_S)),
        )
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class IntakeFilm:
    """A film ready for the model. Shared between everyone who sent the same bytes: read it, never change it.

    key: SHA-256 of the bytes received (the cache's key; FilmIntake.values(key) gives the film's own values).
    image_key: the content hash of model_image, as GenerationRequest.image_key (the backend's caches use it).
    model_image: RGB, 896 px square: the film zero-padded to square and resized as the processor does.
    film: a small copy of the film (at most 512 px) with the loader's source, warnings and view position.
    full_shape: the film's (rows, columns). warnings: the loader's and the film check's, in order.
    verdict: the film check's (None when it is off).
    """

    key: str
    image_key: str
    model_image: Image.Image
    film: Radiograph
    full_shape: tuple[int, int]
    warnings: tuple[str, ...]
    verdict: FilmVerdict | None

    @property
    def plausible(self) -> bool:
        """False only when the film check ran and found the image unlike a frontal chest film (FILM_CHECK=warn)."""
        return self.verdict is None or self.verdict.plausible

    @property
    def source(self) -> str:
        return self.film.source

    @property
    def nbytes(self) -> int:
        width, height = self.model_image.size
        return width * height * len(self.model_image.getbands()) + int(self.film.pixels.nbytes)


class FilmIntake:
    """One per configuration and process (FilmIntake.shared). Thread-safe."""

    def __init__(self, config: IntakeConfig | None = None) -> None:
        self.config = config or IntakeConfig()
        self._reference_path: Path | None = None
        if self.config.film_check != "off":
            self._reference_path = Path(self.config.film_check_reference or REFERENCE_PATH)
            reference_at(self._reference_path)  # a missing or damaged reference stops the server here, not a film
        self._pool: DecodePool | None = None
        self._pool_lock = threading.Lock()
        self._cache: SharedCache[IntakeFilm | FilmValues] = SharedCache(self.config.cache_bytes, _size_of)
        self._slots = threading.BoundedSemaphore(self.config.max_decodes)
        self._count_lock = threading.Lock()
        self._decoding = 0
        self._waiting = 0
        self.peak_decodes = 0  # the most decodes that ever ran at once
        self.decodes = 0  # decodes started, ever (a film served from the cache starts none)

    @classmethod
    def shared(cls, config: IntakeConfig) -> FilmIntake:
        """The process's intake for this configuration: every door of one server gets the same one."""
        with _SHARED_LOCK:
            intake = _SHARED.get(config)
            if intake is None:
                intake = _SHARED[config] = cls(config)
            return intake

    @classmethod
    def for_settings(cls, settings: Any) -> FilmIntake:
        return cls.shared(IntakeConfig.from_settings(settings))

    # --- reading ---------------------------------------------------------------------------------------------------
    def read(self, data: bytes) -> IntakeFilm:
        """The film in `data` (DICOM, PNG or JPEG, sniffed by content). Raises NotAnImage, NotAChestFilm or
        FilmTooLarge, each with a message that says what to do."""
        key = self._key(data)
        return self._film(key, data)

    def read_with_values(self, data: bytes) -> tuple[IntakeFilm, FilmValues]:
        """read(), and from the same decode the film's own values (xray_io.values) for a viewer that windows and
        measures them. Both are kept in the cache (the values under FilmIntake.values(film.key)) as the budget
        allows; they are returned either way."""
        key = self._key(data)
        made: dict[str, IntakeFilm] = {}

        def decode_both() -> FilmValues:
            film, values = self._decode(key, data, keep_values=True)
            made["film"] = film
            if values is None:  # the loader returns them whenever keep_values is set
                raise RuntimeError("the loader returned no film values")
            return values

        values = self._cache.get_or_make(_values_key(key), decode_both)
        if not isinstance(values, FilmValues):
            raise TypeError(f"the film cache held a {type(values).__name__} under a values key")
        return made.get("film") or self._film(key, data), values

    def read_path(self, path: str | os.PathLike[str]) -> IntakeFilm:
        """read() of a file, its size checked before it is read. Errors never name the file."""
        path = Path(path)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise NotAnImage("The file could not be opened. Check that it exists and can be read.") from exc
        if size > self.config.max_bytes:
            raise self._too_large(size)
        return self.read(path.read_bytes())

    async def read_async(self, data: bytes) -> IntakeFilm:
        """read() on a worker thread, for a door on an event loop (the decode never blocks the loop)."""
        import anyio

        return await anyio.to_thread.run_sync(self.read, data)

    def values(self, key: str) -> FilmValues | None:
        """The film's own values kept by read_with_values, or None once the cache has let them go."""
        found = self._cache.get(_values_key(key))
        return found if isinstance(found, FilmValues) else None

    def cached(self, key: str) -> IntakeFilm | None:
        found = self._cache.get(_film_key(key))
        return found if isinstance(found, IntakeFilm) else None

    @property
    def decoding(self) -> int:
        """Decodes running now."""
        with self._count_lock:
            return self._decoding

    @property
    def waiting(self) -> int:
        """Decodes waiting for a free slot now."""
        with self._count_lock:
            return self._waiting

    @property
    def cache_bytes(self) -> int:
        return self._cache.held_bytes

    @property
    def decode_pool(self) -> DecodePool | None:
        """The worker processes decoding films (None until the first decode, and with the deadline off)."""
        return self._pool

    def close(self) -> None:
        """End the decode workers (a later decode starts new ones). Idempotent."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _key(self, data: bytes) -> str:
        if len(data) > self.config.max_bytes:
            raise self._too_large(len(data))
        return hashlib.sha256(data).hexdigest()

    def _too_large(self, size: int) -> FilmTooLarge:
        return FilmTooLarge(
            f"The file is larger than the {self.config.max_bytes / 2**20:g} MiB limit ({size / 2**20:.1f} MiB). "
            "Export a single film at its native resolution."
        )

    def _film(self, key: str, data: bytes) -> IntakeFilm:
        film = self._cache.get_or_make(_film_key(key), lambda: self._decode(key, data, keep_values=False)[0])
        if not isinstance(film, IntakeFilm):  # the "film:" entries hold nothing else
            raise TypeError(f"the film cache held a {type(film).__name__} under a film key")
        return film

    @contextlib.contextmanager
    def _decode_slot(self) -> Iterator[None]:
        """One of the max_decodes slots, held for the decode (waiting for one counts in `waiting`)."""
        with self._count_lock:
            self._waiting += 1
        try:
            self._slots.acquire()
        finally:
            with self._count_lock:
                self._waiting -= 1
        with self._count_lock:
            self._decoding += 1
            self.decodes += 1
            self.peak_decodes = max(self.peak_decodes, self._decoding)
        try:
            yield
        finally:
            with self._count_lock:
                self._decoding -= 1
            self._slots.release()

    # --- one decode ----------------------------------------------------------------------------------------------
    def _decode(self, key: str, data: bytes, keep_values: bool) -> tuple[IntakeFilm, FilmValues | None]:
        config = self.config
        task = DecodeTask(data, config.max_pixels, config.max_bytes, keep_values, self._reference_path)
        with self._decode_slot():
            try:
                decoded = self._run(task)
            except ImageInputError as exc:
                logger.warning("refused a film: %s", type(exc).__name__)
                raise refusal_for(exc) from exc
        verdict = decoded.verdict
        if decoded.inverted and config.film_check == "refuse":
            logger.warning("refused a film: NotAChestFilm (inverted)")
            raise NotAChestFilm(decoded.framing_warnings[0])
        warnings = decoded.preview.warnings + decoded.framing_warnings
        if verdict is not None and not verdict.plausible and not decoded.inverted:
            if config.film_check == "refuse":
                logger.warning("refused a film: NotAChestFilm")
                raise NotAChestFilm(verdict.refusal())
            warnings = (*warnings, verdict.warning())
        film = IntakeFilm(
            key=key,
            image_key=image_content_hash(decoded.model_image),
            model_image=decoded.model_image,
            film=decoded.preview,
            full_shape=decoded.full_shape,
            warnings=warnings,
            verdict=verdict,
        )
        if keep_values:
            self._cache.put(_film_key(key), film)  # the values' decode made the film too: keep both
        return film, decoded.values

    def _run(self, task: DecodeTask) -> DecodedFilm:
        """In a worker process under the deadline, or here when the deadline is off."""
        if self.config.decode_timeout_s == 0:
            return decode_film(task)
        with self._pool_lock:
            if self._pool is None:
                self._pool = DecodePool(self.config.max_decodes, self.config.decode_timeout_s)
            pool = self._pool
        return pool.decode(task)


def _film_key(key: str) -> str:
    return f"film:{key}"


def _values_key(key: str) -> str:
    return f"values:{key}"


def _size_of(entry: IntakeFilm | FilmValues) -> int:
    return entry.nbytes


_SHARED: dict[IntakeConfig, FilmIntake] = {}
_SHARED_LOCK = threading.Lock()
