"""One entry point for uploads: sniff the content (never the extension) and dispatch."""

from __future__ import annotations

import os
from pathlib import Path

from xray_io.errors import UnsupportedImageError
from xray_io.radiograph import Radiograph

MAX_UPLOAD_BYTES = 256 * 1024 * 1024
MIN_SIDE_PIXELS = 64


def is_dicom(data: bytes) -> bool:
    """DICOM Part 10 files carry 'DICM' after a 128-byte preamble."""
    return len(data) >= 132 and data[128:132] == b"DICM"


def load_radiograph(source: bytes | str | os.PathLike, filename: str | None = None) -> Radiograph:
    """Read a chest film from bytes or a path. Raises ImageInputError (with a user-facing message) on bad input."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        filename = filename or path.name
        if not path.is_file():
            raise UnsupportedImageError(f"{filename}: file not found.")
        if path.stat().st_size > MAX_UPLOAD_BYTES:
            raise UnsupportedImageError(f"{filename}: larger than {MAX_UPLOAD_BYTES >> 20} MiB; export a single film.")
        data = path.read_bytes()
    else:
        data = bytes(source)
    filename = filename or "upload"
    if not data:
        raise UnsupportedImageError(f"{filename}: the file is empty.")

    if is_dicom(data):
        from xray_io.dicom import read_dicom

        film = read_dicom(data, filename)
    else:
        from xray_io.raster import read_raster

        film = read_raster(data, filename)
    if min(film.shape) < MIN_SIDE_PIXELS:
        raise UnsupportedImageError(
            f"{filename}: {film.shape[1]}x{film.shape[0]} pixels is too small for a chest film "
            f"(at least {MIN_SIDE_PIXELS} on each side)."
        )
    return film
