"""DICOM radiographs: pydicom's own LUT functions, MedGemma's handling (window, stretch, invert MONOCHROME1).

The header is checked before any pixel is decoded: modality, geometry (Rows x Columns x frames against the pixel
limit), bit depths, photometric interpretation. Nothing here logs or quotes a header value that could identify a
patient: only transfer syntax, modality, geometry and photometric interpretation are logged.
"""

from __future__ import annotations

import io
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from medgemma_xray.xray_io.errors import (
    CorruptImageError,
    ImageTooLargeError,
    MissingCodecError,
    UnsupportedImageError,
    is_native_panic,
)
from medgemma_xray.xray_io.radiograph import MAX_LUT_ENTRIES, Radiograph, to_display_uint8
from medgemma_xray.xray_io.values import FilmValues, first_window, identity_of, pixel_spacing

if TYPE_CHECKING:
    from pydicom.dataset import Dataset
    from pydicom.uid import UID

logger = logging.getLogger(__name__)

RADIOGRAPH_MODALITIES = {"CR": "computed radiography", "DX": "digital radiography", "DR": "digital radiography"}
GRAYSCALE = {"MONOCHROME1", "MONOCHROME2"}
SUPPORTED_BITS_ALLOCATED = (8, 16)
MAX_HEADER_BYTES = 16 << 20  # everything but the pixels, in a deflated file: generous
INFLATE_CHUNK = 1 << 20

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
DEFLATED_SYNTAX = "1.2.840.10008.1.2.1.99"


def read_dicom(data: bytes, *, max_pixels: int, has_preamble: bool = True) -> Radiograph:
    """Decode one single-frame CR/DX radiograph. Raises an ImageInputError subclass for anything else."""
    return _read_dicom(data, max_pixels, has_preamble, keep_values=False)[0]


def read_dicom_with_values(data: bytes, *, max_pixels: int, has_preamble: bool = True) -> tuple[Radiograph, FilmValues]:
    """The radiograph and, from the same decode, the film's own values for a viewer (xray_io.values)."""
    film, values = _read_dicom(data, max_pixels, has_preamble, keep_values=True)
    if values is None:  # _read_dicom computes them whenever keep_values is set
        raise RuntimeError("the DICOM reader returned no values")
    return film, values


def _read_dicom(
    data: bytes, max_pixels: int, has_preamble: bool, keep_values: bool
) -> tuple[Radiograph, FilmValues | None]:
    import pydicom

    _keep_header_values_out_of_warnings()
    _refuse_deflate_bomb(data, has_preamble, max_pixels)
    try:
        dataset = pydicom.dcmread(io.BytesIO(data), force=not has_preamble)
    except MemoryError:
        raise
    except Exception as exc:  # pydicom's parser on a damaged file: any failure means "not readable"
        raise CorruptImageError(
            f"The file could not be read as DICOM ({type(exc).__name__}). "
            "It may be truncated or damaged; export it again from the PACS."
        ) from exc

    _ensure_transfer_syntax(dataset)
    header = _check_header(dataset, max_pixels)
    pixels = _decode_pixels(dataset)
    del dataset.PixelData  # the encoded copy is no longer needed: keep the peak to one copy of the pixels
    values = _film_values(pixels, dataset, header) if keep_values else None  # before `pixels` is consumed below
    warnings: list[str] = []
    invert = header.photometric == "MONOCHROME1" or header.presentation_shape == "INVERSE"
    film = to_display_uint8(pixels, _value_transform(dataset, warnings), invert=invert)
    if header.photometric == "MONOCHROME1":
        # DX files pair MONOCHROME1 with Presentation LUT Shape INVERSE: both say the same thing, so invert once.
        warnings.append("MONOCHROME1 film (white = low attenuation) was inverted to the usual display.")
    elif invert:
        warnings.append("The file asks for an inverted display (Presentation LUT Shape INVERSE); it was inverted.")
    view = _view_warning(dataset, warnings)

    source = f"DICOM {header.modality}, {header.syntax_name}, {header.bits_stored}-bit {header.photometric}"
    logger.info(
        "decoded DICOM: modality=%s syntax=%s size=%dx%d bits=%d photometric=%s view=%s",
        header.modality,
        header.syntax_name,
        film.shape[1],
        film.shape[0],
        header.bits_stored,
        header.photometric,
        view or "unknown",
    )
    return Radiograph(pixels=film, source=source, warnings=tuple(warnings), view_position=view), values


def _film_values(pixels: np.ndarray, dataset: Dataset, header: _Header) -> FilmValues:
    """The stored values through the Modality LUT, as float32, flipped for MONOCHROME1 so that white is
    attenuating; computed per possible value and applied with one lookup (as to_display_uint8 does)."""
    from pydicom.pixels import apply_modality_lut

    low, high = int(pixels.min()), int(pixels.max())
    if high - low + 1 > MAX_LUT_ENTRIES:
        raise UnsupportedImageError(
            f"The pixel values span {low}..{high}, more than 16 bits; export the film with at most 16 bits a pixel."
        )
    try:
        table = np.asarray(apply_modality_lut(np.arange(low, high + 1, dtype=np.int64), dataset), dtype=np.float32)
    except MemoryError:
        raise
    except Exception as exc:
        raise CorruptImageError(
            "The Modality LUT in the header is damaged, so the pixel values cannot be interpreted. "
            "Export the film again from the PACS."
        ) from exc
    if not np.isfinite(table).all():
        raise CorruptImageError(
            "The header's rescale or LUT values turn the pixels into non-numbers; the header is damaged. "
            "Export the film again from the PACS."
        )
    unsigned = pixels.view(np.dtype(f"u{pixels.itemsize}"))
    values: np.ndarray = table[unsigned - unsigned.dtype.type(low % (1 << (8 * pixels.itemsize)))]
    darkest, brightest = float(values.min()), float(values.max())
    window = first_window(dataset)
    if window is None or window[1] < 1:
        window = ((darkest + brightest) / 2, max(brightest - darkest, 1.0))
    if header.photometric == "MONOCHROME1":
        np.subtract(np.float32(darkest + brightest), values, out=values)  # bright = attenuating, as the film
        window = ((darkest + brightest) - window[0], window[1])
    return FilmValues(values, window, pixel_spacing(dataset), header.bits_stored, identity_of(dataset))


def _keep_header_values_out_of_warnings() -> None:
    """pydicom's default reading validation warns with the offending value quoted (a malformed birth date, a
    patient name), and warnings go to the console log. Values are checked here where they matter instead."""
    from pydicom import config

    config.settings.reading_validation_mode = config.IGNORE


def _refuse_deflate_bomb(data: bytes, has_preamble: bool, max_pixels: int) -> None:
    """A deflated data set is inflated whole by pydicom before its header can be read, and deflate expands up to
    1000x (3 MB -> 512 MB). Count the inflated bytes in small chunks first, and refuse more than a film can hold."""
    from pydicom.filereader import _read_file_meta_info, read_preamble  # pydicom 3.0.2, pinned

    stream = io.BytesIO(data)
    try:
        read_preamble(stream, force=not has_preamble)
        meta = _read_file_meta_info(stream)
        syntax = str(meta.get("TransferSyntaxUID", ""))
    except Exception:  # dcmread reports a damaged meta group with its own message
        return
    if syntax != DEFLATED_SYNTAX:
        return
    limit = 2 * max_pixels + MAX_HEADER_BYTES  # 16-bit pixels at most, plus the header
    inflater, inflated = zlib.decompressobj(-zlib.MAX_WBITS), 0
    pending = memoryview(data)[stream.tell() :]
    try:
        while pending and not inflater.eof:
            piece = inflater.decompress(pending, INFLATE_CHUNK)
            inflated += len(piece)
            if inflated > limit:
                raise ImageTooLargeError(
                    f"The deflated DICOM expands beyond {limit >> 20} MiB, more than any film within the limit can "
                    f"hold (the limit is {max_pixels / 1e6:g} Mpx), so it was refused before reading. "
                    "Export the film without deflate compression, at its native resolution."
                )
            pending = memoryview(inflater.unconsumed_tail) if inflater.unconsumed_tail else pending[len(pending) :]
    except zlib.error as exc:
        raise CorruptImageError(
            "The deflated DICOM data is damaged (it does not inflate). Export the film again from the PACS."
        ) from exc


def _ensure_transfer_syntax(dataset: Dataset) -> None:
    """A file without the Part 10 meta group has no Transfer Syntax UID; pydicom found the encoding by reading it,
    and the pixel decoder needs it named."""
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import UID, ExplicitVRLittleEndian, ImplicitVRLittleEndian

    meta = getattr(dataset, "file_meta", None)
    if meta is None:
        meta = dataset.file_meta = FileMetaDataset()
    syntax = _value(meta, "TransferSyntaxUID", "Transfer Syntax UID")
    if not syntax:
        implicit = dataset.original_encoding[0] is not False
        meta.TransferSyntaxUID = ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian
    elif not isinstance(syntax, UID):
        meta.TransferSyntaxUID = UID(str(syntax))


@dataclass(frozen=True)
class _Header:
    """The header facts the decoder relies on, each checked once."""

    modality: str
    photometric: str
    bits_stored: int
    presentation_shape: str
    syntax_name: str


def _check_header(dataset: Dataset, max_pixels: int) -> _Header:
    modality = str(_value(dataset, "Modality", "Modality") or "").strip().upper()
    if not modality:
        raise UnsupportedImageError(
            "The DICOM header has no Modality, so it cannot be checked as a chest radiograph (CR, DX or DR). "
            "Export the film from the PACS with its modality set."
        )
    if modality not in RADIOGRAPH_MODALITIES:
        raise UnsupportedImageError(
            f"The modality is {modality}; this assistant reads chest radiographs only (modality CR, DX or DR). "
            f"Upload a chest X-ray, not a {modality} series."
        )
    if "FloatPixelData" in dataset or "DoubleFloatPixelData" in dataset:
        raise UnsupportedImageError(
            "The film stores floating-point pixel values (Float Pixel Data), which radiographs do not use. "
            "Export it as an integer (8- to 16-bit) DX or CR image."
        )
    if "PixelData" not in dataset:
        raise UnsupportedImageError(
            "The DICOM file holds no image (no Pixel Data); it may be a report or a structured-report object. "
            "Upload the image itself."
        )
    photometric = str(_value(dataset, "PhotometricInterpretation", "Photometric Interpretation") or "").strip()
    if photometric not in GRAYSCALE:
        raise UnsupportedImageError(
            f"The photometric interpretation {photometric or '(missing)'} is not supported; a radiograph must be "
            "MONOCHROME1 or MONOCHROME2. Export the film as grayscale."
        )
    samples = _int_value(dataset, "SamplesPerPixel", "Samples per Pixel", default=1)
    if samples != 1:
        raise UnsupportedImageError(
            f"The film has {samples} samples per pixel; a grayscale radiograph has 1. Export it as grayscale."
        )
    rows = _int_value(dataset, "Rows", "Rows", default=0)
    columns = _int_value(dataset, "Columns", "Columns", default=0)
    frames = _int_value(dataset, "NumberOfFrames", "Number of Frames", default=1) or 1
    if rows <= 0 or columns <= 0 or frames < 0:
        raise CorruptImageError(
            f"The DICOM header gives no valid image size (Rows {rows}, Columns {columns}). "
            "Export the film again from the PACS."
        )
    if rows * columns * frames > max_pixels:
        raise ImageTooLargeError(
            f"The image is {columns}x{rows} pixels{f' x {frames} frames' if frames > 1 else ''} "
            f"({rows * columns * frames / 1e6:.0f} Mpx); the limit is {max_pixels / 1e6:g} Mpx, twice the largest "
            "chest film, so it was refused before decoding. Export the film at its native detector resolution."
        )
    if frames > 1:
        raise UnsupportedImageError(
            f"Multi-frame DICOM ({frames} frames) is not supported; export the single PA frame."
        )
    bits_allocated = _int_value(dataset, "BitsAllocated", "Bits Allocated", default=0)
    bits_stored = _int_value(dataset, "BitsStored", "Bits Stored", default=bits_allocated)
    if bits_allocated not in SUPPORTED_BITS_ALLOCATED:
        raise UnsupportedImageError(
            f"Bits Allocated is {bits_allocated}; radiographs are stored in 8 or 16 bits a pixel. "
            "Export the film as 8- to 16-bit grayscale."
        )
    if not 1 <= bits_stored <= bits_allocated:
        raise CorruptImageError(
            f"The header contradicts itself: Bits Stored ({bits_stored}) must be between 1 and Bits Allocated "
            f"({bits_allocated}). Export the film again from the PACS or the modality."
        )
    for keyword, label in (("RescaleSlope", "Rescale Slope"), ("RescaleIntercept", "Rescale Intercept")):
        if keyword in dataset:
            try:
                number = float(_value(dataset, keyword, label))
            except (TypeError, ValueError) as exc:
                raise CorruptImageError(
                    f"The {label} in the header is not a number, so the pixel values cannot be interpreted. "
                    "Export the film again from the PACS."
                ) from exc
            if not np.isfinite(number) or (keyword == "RescaleSlope" and number == 0):
                raise CorruptImageError(
                    f"The {label} in the header ({number:g}) cannot scale pixel values. "
                    "Export the film again from the PACS."
                )
    shape = str(_value(dataset, "PresentationLUTShape", "Presentation LUT Shape") or "").strip().upper()
    syntax = dataset.file_meta.TransferSyntaxUID
    if not syntax.is_transfer_syntax:
        raise UnsupportedImageError(
            "The file names a transfer syntax that is not a standard DICOM one, so its pixels cannot be decoded. "
            "Export the film again, uncompressed or with a standard compression."
        )
    if syntax.is_encapsulated:
        _check_codestream_size(dataset, syntax, rows, columns, max_pixels)
    return _Header(modality, photometric, bits_stored, shape, syntax.name)


RLE_SYNTAX = "1.2.840.10008.1.2.5"  # sized by the header: the decoder writes Rows x Columns, whatever the data


def _check_codestream_size(dataset: Dataset, syntax: UID, rows: int, columns: int, max_pixels: int) -> None:
    """JPEG-family decoders size their output from the codestream, not from the DICOM header: a 100x100 header
    over a codestream claiming 60000x60000 would allocate gigabytes. Read the codestream's own size first,
    wherever it is (medgemma_xray.xray_io.codestream walks every fragment, marker and box); a codestream with no size found is
    refused, never decoded on trust."""
    from medgemma_xray.xray_io.codestream import Fragments, declared_image
    from medgemma_xray.xray_io.raster import refuse_scan_bomb

    if str(syntax) == RLE_SYNTAX:
        return
    fragments = Fragments.of_pixel_data(_value(dataset, "PixelData", "Pixel Data") or b"")
    declared = declared_image(fragments) if fragments is not None else None
    if declared is None:
        raise CorruptImageError(
            f"The compressed image ({syntax.name}) declares no size that could be found before its pixel data, so "
            "it was refused rather than decoded blind. The file is damaged or not a standard encoding; export the "
            "film again from the PACS."
        )
    width, height = declared.width, declared.height
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"The compressed image inside the file claims {width}x{height} pixels; the limit is "
            f"{max_pixels / 1e6:g} Mpx, so it was refused before decoding. Export the film again from the PACS."
        )
    if (width, height) != (columns, rows):
        raise CorruptImageError(
            f"The header says {columns}x{rows} pixels but the compressed image inside is {width}x{height}; "
            "the file is inconsistent. Export the film again from the PACS."
        )
    if declared.components != 1:
        raise CorruptImageError(
            f"The header says one sample per pixel but the compressed image inside has {declared.components} "
            "components; the file is inconsistent. Export the film again from the PACS as grayscale."
        )
    if fragments is not None and fragments.read(0, 2) == b"\xff\xd8":  # JPEG and JPEG-LS: scans, as in a file
        refuse_scan_bomb(fragments)


def _value(dataset: Dataset, keyword: str, label: str) -> Any:
    """A header value, converted by pydicom; a damaged element is the file's fault, said by name."""
    try:
        return dataset.get(keyword)
    except MemoryError:
        raise
    except Exception as exc:
        raise CorruptImageError(
            f"The DICOM header's {label} element is damaged. Export the film again from the PACS."
        ) from exc


def _int_value(dataset: Dataset, keyword: str, label: str, default: int) -> int:
    value = _value(dataset, keyword, label)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise CorruptImageError(
            f"The DICOM header's {label} is not a whole number. Export the film again from the PACS."
        ) from exc


def _decode_pixels(dataset: Dataset) -> np.ndarray:
    from pydicom.pixels import pixel_array

    syntax = dataset.file_meta.TransferSyntaxUID
    try:
        pixels = pixel_array(dataset)
    except MemoryError:
        raise
    except (RuntimeError, NotImplementedError, ImportError) as exc:
        # pydicom says RuntimeError when no plugin is installed; a half-installed plugin raises ImportError.
        # "missing dependencies": pydicom found no usable plugin. "raised by all available plugins": decoders ran
        # and refused the data (an RLE frame with too little data, say), which is damage, not a missing package.
        if syntax.is_compressed and (isinstance(exc, ImportError) or not _decoder_available(syntax)):
            package = CODEC_PACKAGES.get(str(syntax), "a pydicom pixel-data plugin")
            raise MissingCodecError(
                f"The pixel data is compressed as {syntax.name}, and no installed decoder can read it. "
                f"Install {package} (pip install {package}) or export the film uncompressed."
            ) from exc
        raise CorruptImageError(
            f"The pixel data could not be decoded ({type(exc).__name__}). The file may be truncated or damaged; "
            "export it again."
        ) from exc
    except BaseException as exc:  # the decoders' own errors on damaged pixel data
        if not isinstance(exc, Exception) and not is_native_panic(exc):
            raise
        raise CorruptImageError(
            f"The pixel data could not be decoded ({type(exc).__name__}). The file may be truncated; export it again."
        ) from exc
    if pixels.ndim != 2 or pixels.dtype.kind not in "iu":
        raise CorruptImageError(
            f"The pixel data decoded to {pixels.dtype} {pixels.shape}, not one grayscale frame of integers. "
            "Export the film again from the PACS."
        )
    return pixels


def _decoder_available(syntax: UID) -> bool:
    from pydicom.pixels import get_decoder

    try:
        return get_decoder(syntax).is_available
    except (NotImplementedError, ValueError):  # a syntax pydicom has no decoder for at all
        return False


def _value_transform(dataset: Dataset, warnings: list[str]) -> Callable[[np.ndarray], np.ndarray]:
    """Modality LUT (rescale slope/intercept or LUT), then the VOI LUT or first window, as pydicom defines them.

    Returned as a function of the stored values, so that it runs on a table of them rather than on every pixel.
    An unusable window (a width under 1, a non-number) is the one header fault shown as a warning, not refused:
    the film is still readable over its full range.
    """
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    has_voi = "VOILUTSequence" in dataset or ("WindowCenter" in dataset and "WindowWidth" in dataset)
    if not has_voi:
        warnings.append("No VOI LUT or window in the file: the full pixel range was used.")

    def transform(values: np.ndarray) -> np.ndarray:
        try:
            modality_values = apply_modality_lut(values, dataset)
        except MemoryError:
            raise
        except Exception as exc:
            raise CorruptImageError(
                "The Modality LUT in the header is damaged, so the pixel values cannot be interpreted. "
                "Export the film again from the PACS."
            ) from exc
        if not has_voi:
            return modality_values
        try:
            return apply_voi_lut(modality_values, dataset, index=0, prefer_lut=True)
        except MemoryError:
            raise
        except Exception:
            warnings.append(
                "The file's window or VOI LUT is unusable (for example a Window Width of 0): "
                "the full pixel range was used instead."
            )
            return modality_values

    return transform


def _view_warning(dataset: Dataset, warnings: list[str]) -> str | None:
    view = str(_value(dataset, "ViewPosition", "View Position") or "").strip().upper() or None
    if view is None:
        warnings.append("View position is not recorded; MedGemma was trained on PA chest films.")
    elif view != "PA":
        warnings.append(f"View position is {view}, not PA: MedGemma was trained on PA chest films, so read with care.")
    return view
