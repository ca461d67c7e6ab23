"""PNG and JPEG films through Pillow: 8-bit kept as is, 16-bit stretched to 8-bit like DICOM."""

from __future__ import annotations

import io
import logging

import numpy as np

from xray_io.errors import CorruptImageError, UnsupportedImageError
from xray_io.radiograph import Radiograph, stretch_to_uint8

logger = logging.getLogger(__name__)

SUPPORTED_FORMATS = {"PNG", "JPEG"}


def read_raster(data: bytes, filename: str = "upload") -> Radiograph:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except UnidentifiedImageError as exc:
        raise UnsupportedImageError(
            f"{filename}: not a PNG, JPEG or DICOM file. Upload the chest X-ray as DICOM (.dcm), PNG or JPEG."
        ) from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise CorruptImageError(f"{filename}: the image could not be decoded ({exc}); it may be truncated.") from exc

    if image.format not in SUPPORTED_FORMATS:
        raise UnsupportedImageError(f"{filename}: {image.format} images are not supported; convert it to PNG.")
    warnings: list[str] = ["No DICOM header: the view position (PA) could not be checked."]
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        film = stretch_to_uint8(np.asarray(image))
        depth = "16-bit"
    elif image.mode in ("L", "LA"):
        film = np.asarray(image.convert("L"))
        depth = "8-bit"
    elif image.mode in ("RGB", "RGBA", "P", "CMYK", "YCbCr"):
        rgb = np.asarray(image.convert("RGB"))
        if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 1], rgb[..., 2])):
            warnings.append("The image has colour; it was converted to grayscale.")
        film = np.asarray(image.convert("L"))
        depth = "8-bit colour"
    else:
        raise UnsupportedImageError(
            f"{filename}: pixel mode {image.mode} is not supported; save it as 8- or 16-bit PNG."
        )
    logger.info("decoded %s %s size=%dx%d", image.format, depth, film.shape[1], film.shape[0])
    return Radiograph(pixels=np.ascontiguousarray(film), source=f"{image.format} {depth}", warnings=tuple(warnings))
