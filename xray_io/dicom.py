"""DICOM radiographs: pydicom's own LUT functions, MedGemma's handling (window, stretch, invert MONOCHROME1).

Nothing here logs a patient identifier: only transfer syntax, modality, geometry and photometric interpretation.
"""

from __future__ import annotations

import io
import logging

import numpy as np

from xray_io.errors import CorruptImageError, MissingCodecError, UnsupportedImageError
from xray_io.radiograph import Radiograph, stretch_to_uint8

logger = logging.getLogger(__name__)

RADIOGRAPH_MODALITIES = {"CR": "computed radiography", "DX": "digital radiography", "DR": "digital radiography"}
GRAYSCALE = {"MONOCHROME1", "MONOCHROME2"}

# Which package decodes each compressed transfer syntax (for the "install X" message).
CODEC_PACKAGES = {
    "1.2.840.10008.1.2.4.50": "pylibjpeg-libjpeg",  # JPEG Baseline
    "1.2.840.10008.1.2.4.51": "pylibjpeg-libjpeg",  # JPEG Extended
    "1.2.840.10008.1.2.4.57": "pylibjpeg-libjpeg",  # JPEG Lossless
    "1.2.840.10008.1.2.4.70": "pylibjpeg-libjpeg",  # JPEG Lossless SV1
    "1.2.840.10008.1.2.4.80": "pyjpegls",  # JPEG-LS Lossless
    "1.2.840.10008.1.2.4.81": "pyjpegls",  # JPEG-LS Near-lossless
    "1.2.840.10008.1.2.4.90": "pylibjpeg-openjpeg",  # JPEG 2000 Lossless
    "1.2.840.10008.1.2.4.91": "pylibjpeg-openjpeg",  # JPEG 2000
    "1.2.840.10008.1.2.5": "pylibjpeg-rle",  # RLE Lossless
}


def read_dicom(data: bytes, filename: str = "upload") -> Radiograph:
    """Decode one single-frame CR/DX radiograph. Raises an ImageInputError subclass for anything else."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        dataset = pydicom.dcmread(io.BytesIO(data))
    except (InvalidDicomError, EOFError, OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptImageError(
            f"{filename}: could not be read as DICOM ({type(exc).__name__}: {exc}). "
            "The file may be truncated or damaged; export it again from the PACS."
        ) from exc

    _check_is_radiograph(dataset, filename)
    pixels = _decode_pixels(dataset, filename)
    warnings: list[str] = []
    pixels = _apply_luts(pixels, dataset, warnings)
    photometric = dataset.PhotometricInterpretation
    film = stretch_to_uint8(pixels)
    if photometric == "MONOCHROME1":
        film = 255 - film
        warnings.append("MONOCHROME1 film (white = low attenuation) was inverted to the usual display.")
    view = _view_warning(dataset, warnings)

    syntax = dataset.file_meta.TransferSyntaxUID
    bits = int(getattr(dataset, "BitsStored", dataset.BitsAllocated))
    source = f"DICOM {dataset.Modality}, {syntax.name}, {bits}-bit {photometric}"
    logger.info(
        "decoded DICOM: modality=%s syntax=%s size=%dx%d bits=%d photometric=%s view=%s",
        dataset.Modality, syntax.name, film.shape[1], film.shape[0], bits, photometric, view or "unknown",
    )  # fmt: skip
    return Radiograph(pixels=film, source=source, warnings=tuple(warnings), view_position=view)


def _check_is_radiograph(dataset, filename: str) -> None:
    modality = str(getattr(dataset, "Modality", "") or "").upper()
    if modality not in RADIOGRAPH_MODALITIES:
        shown = modality or "missing"
        raise UnsupportedImageError(
            f"{filename}: modality is {shown}; this assistant reads chest radiographs only "
            f"(modality CR, DX or DR). Upload a chest X-ray, not a {shown} series."
        )
    if "PixelData" not in dataset:
        raise UnsupportedImageError(f"{filename}: the DICOM file has no pixel data (is it a report or a SR object?).")
    photometric = str(getattr(dataset, "PhotometricInterpretation", ""))
    if photometric not in GRAYSCALE:
        raise UnsupportedImageError(
            f"{filename}: photometric interpretation {photometric or 'missing'} is not supported; a radiograph "
            "must be MONOCHROME1 or MONOCHROME2. Export the film as grayscale."
        )
    frames = int(getattr(dataset, "NumberOfFrames", 1) or 1)
    if frames > 1:
        raise UnsupportedImageError(
            f"{filename}: multi-frame DICOM ({frames} frames) is not supported; export the single PA frame."
        )


def _decode_pixels(dataset, filename: str) -> np.ndarray:
    syntax = dataset.file_meta.TransferSyntaxUID
    try:
        return dataset.pixel_array
    except (RuntimeError, NotImplementedError, ImportError) as exc:
        # pydicom says RuntimeError when no plugin is installed; a half-installed plugin raises ImportError.
        if syntax.is_compressed and (
            isinstance(exc, ImportError) or "plugin" in str(exc).lower() or "decod" in str(exc).lower()
        ):
            package = CODEC_PACKAGES.get(str(syntax), "a pydicom pixel-data plugin")
            raise MissingCodecError(
                f"{filename}: pixel data is compressed as {syntax.name}, and no installed decoder can read it. "
                f"Install {package} (pip install {package}) or export the film uncompressed."
            ) from exc
        raise CorruptImageError(f"{filename}: pixel data could not be decoded ({exc}).") from exc
    except (ValueError, EOFError, OSError, KeyError, AttributeError, TypeError) as exc:
        raise CorruptImageError(
            f"{filename}: pixel data could not be decoded ({type(exc).__name__}: {exc}). "
            "The file may be truncated; export it again."
        ) from exc


def _apply_luts(pixels: np.ndarray, dataset, warnings: list[str]) -> np.ndarray:
    """Modality LUT (rescale slope/intercept or LUT), then the VOI LUT or first window, as pydicom defines them."""
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    values = apply_modality_lut(pixels, dataset)
    has_voi = "VOILUTSequence" in dataset or "WindowCenter" in dataset
    if has_voi:
        values = apply_voi_lut(values, dataset, index=0, prefer_lut=True)
    else:
        warnings.append("No VOI LUT or window in the file: the full pixel range was used.")
    return np.asarray(values)


def _view_warning(dataset, warnings: list[str]) -> str | None:
    view = str(getattr(dataset, "ViewPosition", "") or "").strip().upper() or None
    if view is None:
        warnings.append("View position is not recorded; MedGemma was trained on PA chest films.")
    elif view != "PA":
        warnings.append(f"View position is {view}, not PA: MedGemma was trained on PA chest films, so read with care.")
    return view
