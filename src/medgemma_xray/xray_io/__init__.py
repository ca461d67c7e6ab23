"""Radiograph input: bytes in (DICOM, PNG, JPEG), an 8-bit grayscale film plus warnings out."""

from medgemma_xray.xray_io.errors import CorruptImageError, ImageInputError, MissingCodecError, UnsupportedImageError
from medgemma_xray.xray_io.loader import load_radiograph
from medgemma_xray.xray_io.radiograph import Radiograph

__all__ = [
    "CorruptImageError",
    "ImageInputError",
    "MissingCodecError",
    "Radiograph",
    "UnsupportedImageError",
    "load_radiograph",
]
