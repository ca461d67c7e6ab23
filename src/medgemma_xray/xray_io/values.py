"""A film's own values for a viewer, from the same decode that makes the model's 8-bit film.

The model reads an 8-bit film stretched over its window; a teaching viewer needs the values the detector stored
(after the Modality LUT) to window, level and measure. Both come from one pass of the loader, so the viewer never
decodes a file itself (and never bypasses the loader's checks on size, codestreams and bombs).

Values are "display-ordered": higher is more attenuating (white), as a radiologist reads a film.
- DICOM: the stored values through the Modality LUT (rescale or LUT), flipped for MONOCHROME1; the file's own
  window (first Window Center/Width) is the default; without one, the full range.
- PNG/JPEG: the 8 or 16 bits given; the default window spans the bit depth in use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pydicom.dataset import Dataset

# The source's patient and study attributes: kept only for a DICOM SR export that the operator allows, and as
# strings to scrub from every other export.
IDENTITY_KEYWORDS = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "AccessionNumber",
    "StudyID",
    "StudyDate",
    "StudyTime",
    "StudyInstanceUID",
    "SeriesInstanceUID",
    "SOPInstanceUID",
    "SOPClassUID",
    "ReferringPhysicianName",
)


@dataclass(frozen=True)
class FilmValues:
    """values: float32 (rows, columns), display-ordered. default_window: (centre, width) in the same units.
    pixel_spacing_mm: (between rows, between columns), None when the file records none. bits: the stored depth."""

    values: np.ndarray
    default_window: tuple[float, float]
    pixel_spacing_mm: tuple[float, float] | None
    bits: int
    identity: Mapping[str, str] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        rows, columns = self.values.shape
        return rows, columns

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)


def raster_values(pixels: np.ndarray, bits: int) -> FilmValues:
    """An 8- or 16-bit raster's values as given; the default window spans the bit depth."""
    return FilmValues(pixels.astype(np.float32), (2**bits / 2, float(2**bits)), None, bits)


def first_window(dataset: Dataset) -> tuple[float, float] | None:
    """The first Window Center/Width of a DICOM data set, or None when absent, unreadable or not finite."""
    try:
        centre, width = dataset.get("WindowCenter"), dataset.get("WindowWidth")
    except Exception:  # a damaged element: the film is still shown over its full range
        return None
    if centre is None or width is None:
        return None
    try:
        centre = centre[0] if hasattr(centre, "__getitem__") and not isinstance(centre, str) else centre
        width = width[0] if hasattr(width, "__getitem__") and not isinstance(width, str) else width
        centre, width = float(centre), float(width)
    except (TypeError, ValueError, IndexError):
        return None
    return (centre, width) if math.isfinite(centre) and math.isfinite(width) else None


def pixel_spacing(dataset: Dataset) -> tuple[float, float] | None:
    """PixelSpacing, else ImagerPixelSpacing, in mm; None when absent or not two positive numbers."""
    try:
        raw = dataset.get("PixelSpacing") or dataset.get("ImagerPixelSpacing")
        if raw is not None and len(raw) == 2 and all(float(v) > 0 for v in raw):
            return float(raw[0]), float(raw[1])
    except (TypeError, ValueError):
        pass
    except Exception:  # a damaged element: uncalibrated
        pass
    return None


def identity_of(dataset: Dataset) -> dict[str, str]:
    identity = {}
    for keyword in IDENTITY_KEYWORDS:
        try:
            value = str(dataset.get(keyword, "") or "")
        except Exception:  # a damaged element is simply not copied
            continue
        if value.strip():
            identity[keyword] = value
    return identity
