"""The one image type that flows from the loaders to the model."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
        return self.pixels.shape  # type: ignore[return-value]


def stretch_to_uint8(values: np.ndarray) -> np.ndarray:
    """Min-max stretch to 0-255 (MedGemma's DICOM handling). A flat image cannot be stretched and is refused."""
    values = values.astype(np.float64, copy=False)
    low, high = float(values.min()), float(values.max())
    if high <= low:
        from xray_io.errors import UnsupportedImageError

        raise UnsupportedImageError(
            f"The image is blank: every pixel has the value {low:g}. Check the export settings and upload the film again."
        )
    return np.round((values - low) * (255.0 / (high - low))).astype(np.uint8)
