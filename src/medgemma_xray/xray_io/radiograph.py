"""The one image type that flows from the loaders to the model, and the mapping of stored values onto it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from medgemma_xray.xray_io.errors import CorruptImageError, UnsupportedImageError

MAX_LUT_ENTRIES = 1 << 16  # distinct stored values a film may span: 16 bits, the most any detector stores


@dataclass(frozen=True)
class Radiograph:
    """An 8-bit grayscale film, brightest = most attenuating (bone white), as a radiologist reads it.

    pixels: uint8 array of shape (rows, columns), stretched to the full 0-255 range for DICOM and 16-bit input.
    source: a short description of the input ("DICOM CR, JPEG 2000 Lossless, 12-bit", "PNG 8-bit").
    warnings: things the user should see (view is not PA, MONOCHROME1 was inverted, ...).
    view_position: the DICOM ViewPosition if known ("PA", "AP", "LL", ...), else None.
    """

    pixels: np.ndarray
    source: str
    warnings: tuple[str, ...] = field(default=())
    view_position: str | None = None

    def __post_init__(self) -> None:
        if self.pixels.dtype != np.uint8 or self.pixels.ndim != 2:
            raise ValueError(
                f"Radiograph.pixels must be a 2-D uint8 array, got {self.pixels.dtype} {self.pixels.shape}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        rows, columns = self.pixels.shape
        return rows, columns


def to_display_uint8(
    pixels: np.ndarray,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    invert: bool = False,
) -> np.ndarray:
    """Integer stored values -> 8-bit film: `transform` (value -> display value, e.g. pydicom's modality and VOI
    LUTs), a min-max stretch over the values present (MedGemma's DICOM handling), then optional inversion.

    Every step depends on the stored value alone, so it is computed once per possible value (at most 65536) and
    applied with one table lookup. Peak memory is the input plus the 1-byte output; computing it pixel by pixel
    makes float64 copies of 8 bytes a pixel each (320 MB apiece for a 40 Mpx film). `pixels` is consumed: its
    buffer becomes the lookup index.
    """
    if pixels.dtype.kind not in "iu":
        raise TypeError(f"stored pixel values must be integers, got {pixels.dtype}")
    low, high = int(pixels.min()), int(pixels.max())
    span = high - low + 1
    if span > MAX_LUT_ENTRIES:
        raise UnsupportedImageError(
            f"The pixel values span {low}..{high}, more than 16 bits; export the film with at most 16 bits a pixel."
        )
    # The same bytes read as unsigned: value - low wraps into [0, span), which always fits.
    index = pixels.view(np.dtype(f"u{pixels.itemsize}"))
    index -= index.dtype.type(low % (1 << (8 * pixels.itemsize)))
    present = np.zeros(span, dtype=bool)
    present[index] = True

    values = np.arange(low, high + 1, dtype=np.int64)
    table = np.asarray(transform(values) if transform is not None else values, dtype=np.float64)
    shown = table[present]
    if not np.isfinite(shown).all():
        raise CorruptImageError(
            "The header's rescale or LUT values turn the pixels into non-numbers; the header is damaged. "
            "Export the film again from the PACS."
        )
    darkest, brightest = float(shown.min()), float(shown.max())
    if brightest <= darkest:
        raise UnsupportedImageError(
            f"The image is blank: every pixel shows the value {darkest:g}. "
            "Check the export settings and upload the film again."
        )
    lut = np.clip(np.round((table - darkest) * (255.0 / (brightest - darkest))), 0, 255).astype(np.uint8)
    if invert:
        lut = 255 - lut
    shown_pixels: np.ndarray = lut[index]  # a fancy index of an array is an array (numpy types it Any)
    return shown_pixels
