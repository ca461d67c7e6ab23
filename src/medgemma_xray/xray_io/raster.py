"""PNG and JPEG films through Pillow: 8-bit kept as is, 16-bit stretched to 8-bit like DICOM, EXIF orientation
applied. The pixel count is checked from Pillow's header read, before anything is decoded."""

from __future__ import annotations

import io
import logging
from typing import TYPE_CHECKING

import numpy as np

from medgemma_xray.xray_io.codestream import Bytes, Stream, count_jpeg_scans
from medgemma_xray.xray_io.errors import CorruptImageError, ImageTooLargeError, UnsupportedImageError
from medgemma_xray.xray_io.radiograph import Radiograph, to_display_uint8
from medgemma_xray.xray_io.values import FilmValues, raster_values

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

SUPPORTED_FORMATS = {"PNG", "JPEG", "MPO"}  # MPO: a phone's JPEG with more images after the first
# Each scan of a progressive JPEG is a full decoder pass over the image. Encoders write about ten (Pillow 6,
# jpegtran's default progression 10 for colour); thousands of empty scans make a 1.4 MiB file decode for a minute.
MAX_JPEG_SCANS = 100
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I")
COLOUR_MODES = ("RGB", "RGBA", "P", "PA", "CMYK", "YCbCr", "LAB", "HSV")
ROTATIONS = {3: "rotated 180°", 6: "rotated 90° clockwise", 8: "rotated 90° anticlockwise"}


def read_raster(data: bytes, *, max_pixels: int) -> Radiograph:
    return _read_raster(data, max_pixels, keep_values=False)[0]


def read_raster_with_values(data: bytes, *, max_pixels: int) -> tuple[Radiograph, FilmValues]:
    """The radiograph and, from the same decode, its 8 or 16 bits as given (xray_io.values), upright."""
    film, values = _read_raster(data, max_pixels, keep_values=True)
    if values is None:  # _read_raster computes them whenever keep_values is set
        raise RuntimeError("the raster reader returned no values")
    return film, values


def _read_raster(data: bytes, max_pixels: int, keep_values: bool) -> tuple[Radiograph, FilmValues | None]:
    from PIL import Image, UnidentifiedImageError

    try:
        image: Image.Image = Image.open(io.BytesIO(data))  # reads the header only
    except UnidentifiedImageError as exc:
        raise UnsupportedImageError(
            "This is not a PNG, JPEG or DICOM file. Upload the chest X-ray as DICOM (.dcm), PNG or JPEG."
        ) from exc
    except Image.DecompressionBombError as exc:  # Pillow's own guard, at twice its MAX_IMAGE_PIXELS
        raise _too_large(None, max_pixels) from exc
    except ValueError as exc:
        if "MAX_TEXT_CHUNK" in str(exc):  # Pillow's guard on compressed text chunks (zTXt, iTXt) in a PNG
            raise ImageTooLargeError(
                "The PNG carries a compressed text chunk that expands beyond the limit for metadata (a "
                "decompression bomb), so it was refused before decoding. Save the film again without text metadata."
            ) from exc
        raise CorruptImageError("The image header is damaged; the file may be truncated. Export it again.") from exc
    except (OSError, SyntaxError, EOFError) as exc:
        raise CorruptImageError("The image header is damaged; the file may be truncated. Export it again.") from exc

    if image.format not in SUPPORTED_FORMATS:
        raise UnsupportedImageError(f"{image.format} images are not supported; convert the film to PNG.")
    width, height = image.size
    if width * height > max_pixels:
        raise _too_large(f"{width}x{height} pixels ({width * height / 1e6:.0f} Mpx)", max_pixels)
    warnings: list[str] = ["No DICOM header: the view position (PA) could not be checked."]
    if image.format in ("JPEG", "MPO"):
        refuse_scan_bomb(Bytes(data))
    if image.format == "MPO":  # Pillow opens the first image; the others (a depth map, a preview) are ignored
        warnings.append(
            f"The file holds {getattr(image, 'n_frames', 1)} images (MPO, as phones write); the first was read."
        )
    try:
        image.load()
    except Image.DecompressionBombError as exc:
        raise _too_large(f"{width}x{height} pixels", max_pixels) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise CorruptImageError(
            f"The image could not be decoded ({type(exc).__name__}); it may be truncated. Export it again."
        ) from exc

    image = _apply_exif_orientation(image, warnings)
    kind = "JPEG" if image.format == "MPO" else image.format
    sixteen_bits = keep_values and image.mode in SIXTEEN_BIT_MODES
    values = raster_values(np.asarray(image), 16) if sixteen_bits else None
    film, depth = _grayscale_pixels(image, warnings)
    del image  # Pillow's copy of the pixels goes before the film is returned
    if keep_values and values is None:
        values = raster_values(film, 8)  # 8 bits as given (grayscale conversion and orientation applied)
    logger.info("decoded %s %s size=%dx%d", kind, depth, film.shape[1], film.shape[0])
    return Radiograph(pixels=film, source=f"{kind} {depth}", warnings=tuple(warnings)), values


def refuse_scan_bomb(stream: Stream) -> None:
    """Refuse a JPEG codestream (a file's, or a DICOM frame's fragments) with more than MAX_JPEG_SCANS scans."""
    if count_jpeg_scans(stream) > MAX_JPEG_SCANS:
        raise UnsupportedImageError(
            f"The JPEG is split into more than {MAX_JPEG_SCANS} scans (progressive encoders write about ten, and "
            "each scan that carries data costs the decoder another pass over the whole image), so it was refused "
            "before decoding. Save the film again as PNG or as a baseline JPEG."
        )


def _grayscale_pixels(image: Image.Image, warnings: list[str]) -> tuple[np.ndarray, str]:
    if image.mode in SIXTEEN_BIT_MODES:
        return to_display_uint8(np.array(image)), "16-bit"
    if image.mode == "L":
        return np.array(image), "8-bit"
    if image.mode in ("LA", "1"):
        return np.array(image.convert("L")), "8-bit"
    if image.mode in COLOUR_MODES:
        rgb = np.asarray(image.convert("RGB"))
        if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 1], rgb[..., 2])):
            warnings.append("The image has colour; it was converted to grayscale.")
        del rgb
        return np.array(image.convert("L")), "8-bit colour"
    raise UnsupportedImageError(f"Pixel mode {image.mode} is not supported; save the film as 8- or 16-bit PNG.")


def _apply_exif_orientation(image: Image.Image, warnings: list[str]) -> Image.Image:
    """Cameras and phones store the sensor's rows and name the rotation in EXIF; viewers rotate, and so must we,
    or the model sees the film sideways."""
    from PIL import ImageOps

    try:
        orientation = image.getexif().get(0x0112, 1)
        rotated = ImageOps.exif_transpose(image)
    except MemoryError:
        raise
    except Exception:  # EXIF is untrusted metadata; a damaged block must not cost the film
        warnings.append("The image's EXIF block is damaged, so its orientation could not be read; shown as stored.")
        return image
    if rotated is not image and orientation != 1:
        turn = ROTATIONS.get(orientation, "mirrored or rotated")
        warnings.append(f"The image's EXIF orientation says it is {turn}; it was turned upright.")
        rotated.format = image.format
        return rotated
    return image


def _too_large(size: str | None, max_pixels: int) -> ImageTooLargeError:
    declared = f"The image is {size}" if size else "The image declares far more pixels than any film"
    return ImageTooLargeError(
        f"{declared}; the limit is {max_pixels / 1e6:g} Mpx, twice the largest chest film, so it was refused "
        "before decoding. Export the film at its native resolution."
    )
