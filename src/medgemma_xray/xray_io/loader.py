"""One entry point for uploads: sniff the content (never the extension), check the limits, dispatch.

Every failure on a file leaves here as an ImageInputError subclass with a message for the user; nothing a file
contains can turn into an internal error or take the server down.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from medgemma_xray.xray_io.errors import (
    ImageInputError,
    ImageTooLargeError,
    UnexpectedImageError,
    UnsupportedImageError,
    is_native_panic,
)
from medgemma_xray.xray_io.radiograph import Radiograph
from medgemma_xray.xray_io.values import FilmValues

logger = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 256 * 1024 * 1024
# Twice the largest real chest film (43 x 43 cm at 0.1 mm is ~18.5 Mpx): anything bigger is refused from its header.
DEFAULT_MAX_PIXELS = 40_000_000
MIN_SIDE_PIXELS = 64


def is_dicom(data: bytes) -> bool:
    """DICOM Part 10 files carry 'DICM' after a 128-byte preamble."""
    return len(data) >= 132 and data[128:132] == b"DICM"


def is_dicom_without_preamble(data: bytes) -> bool:
    """A DICOM data set written without the preamble and 'DICM' (older writers; still valid to read) starts with
    its first element: a little-endian tag of group 0002 (file meta) or 0008 (identification), low element."""
    if len(data) < 8:
        return False
    group, element = int.from_bytes(data[0:2], "little"), int.from_bytes(data[2:4], "little")
    return group in (0x0002, 0x0008) and element < 0x0100


def load_radiograph(
    source: bytes | str | os.PathLike[str],
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int = MAX_UPLOAD_BYTES,
) -> Radiograph:
    """Read a chest film from bytes or a path. Raises ImageInputError (with a user-facing message) on bad input.

    It takes no file name: names may hold patient names, so they never enter a message or a log.
    max_pixels: rows x columns (x frames) allowed, checked from the header before any pixel is decoded.
    """
    return _load(source, max_pixels, max_bytes, keep_values=False)[0]


def _load(
    source: bytes | str | os.PathLike[str], max_pixels: int, max_bytes: int, keep_values: bool
) -> tuple[Radiograph, FilmValues | None]:
    data = _read(source, max_bytes)
    try:
        film, values = _decode(data, max_pixels, keep_values)
    except ImageInputError:
        raise
    except MemoryError as exc:
        raise ImageTooLargeError(
            "The server ran out of memory decoding this film. Export it at a lower resolution and try again."
        ) from exc
    except BaseException as exc:  # the last line: a file must never become an internal error
        if not isinstance(exc, Exception) and not is_native_panic(exc):
            raise  # KeyboardInterrupt, SystemExit, GeneratorExit
        logger.error("unexpected loader failure: %s", type(exc).__name__)
        raise UnexpectedImageError(
            "The file could not be read: its content does not match its format. "
            "Export the film again as DICOM, PNG or JPEG."
        ) from exc
    if min(film.shape) < MIN_SIDE_PIXELS:
        raise UnsupportedImageError(
            f"The image is {film.shape[1]}x{film.shape[0]} pixels, too small for a chest film "
            f"(at least {MIN_SIDE_PIXELS} on each side)."
        )
    return film, values


def load_radiograph_with_values(
    data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, max_bytes: int = MAX_UPLOAD_BYTES
) -> tuple[Radiograph, FilmValues]:
    """load_radiograph, plus the film's own values from the same decode (xray_io.values: what a viewer windows
    and measures). The same checks, limits and errors."""
    film, values = _load(data, max_pixels, max_bytes, keep_values=True)
    if values is None:  # the readers return them whenever keep_values is set
        raise RuntimeError("the film reader returned no values")
    return film, values


def _read(source: bytes | str | os.PathLike[str], max_bytes: int) -> bytes:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise UnsupportedImageError("The file was not found. Upload it again.")
        size = path.stat().st_size
        if size > max_bytes:
            raise ImageTooLargeError(
                f"The file is larger than the {max_bytes / 2**20:g} MiB limit ({size / 2**20:.1f} MiB). Export a single film."
            )
        data = path.read_bytes()
    else:
        data = bytes(source)
        if len(data) > max_bytes:
            raise ImageTooLargeError(
                f"The file is larger than the {max_bytes / 2**20:g} MiB limit ({len(data) / 2**20:.1f} MiB). "
                "Export a single film."
            )
    if not data:
        raise UnsupportedImageError("The file is empty. Upload the chest X-ray again.")
    return data


def _decode(data: bytes, max_pixels: int, keep_values: bool) -> tuple[Radiograph, FilmValues | None]:
    if is_dicom(data) or is_dicom_without_preamble(data):
        from medgemma_xray.xray_io.dicom import read_dicom, read_dicom_with_values

        if keep_values:
            return read_dicom_with_values(data, max_pixels=max_pixels, has_preamble=is_dicom(data))
        return read_dicom(data, max_pixels=max_pixels, has_preamble=is_dicom(data)), None
    from medgemma_xray.xray_io.raster import read_raster, read_raster_with_values

    if keep_values:
        return read_raster_with_values(data, max_pixels=max_pixels)
    return read_raster(data, max_pixels=max_pixels), None
