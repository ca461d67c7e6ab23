"""Synthetic chest-phantom films for tests, demos and pipeline checks. Every file is labelled SYNTHETIC.

A phantom has lungs, heart, spine, ribs, clavicles and diaphragm at plausible densities, so windowing,
inversion and padding bugs show up as wrong pixels. It is not anatomy: never calibrate a real engine on it.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

SYNTHETIC_LABEL = "SYNTHETIC PHANTOM - not a patient image"

UNCOMPRESSED_SYNTAXES = {
    "implicit-vr-little-endian": "1.2.840.10008.1.2",
    "explicit-vr-little-endian": "1.2.840.10008.1.2.1",
    "deflated-explicit-vr-little-endian": "1.2.840.10008.1.2.1.99",  # native pixels, the whole data set deflated
}
COMPRESSED_SYNTAXES = {
    "jpeg-baseline": "1.2.840.10008.1.2.4.50",
    "jpeg-lossless-sv1": "1.2.840.10008.1.2.4.70",
    "jpeg-ls-lossless": "1.2.840.10008.1.2.4.80",
    "jpeg-2000-lossless": "1.2.840.10008.1.2.4.90",
    "jpeg-2000": "1.2.840.10008.1.2.4.91",
    "rle-lossless": "1.2.840.10008.1.2.5",
}
TRANSFER_SYNTAXES = {**UNCOMPRESSED_SYNTAXES, **COMPRESSED_SYNTAXES}
SOP_CLASSES = {
    "DX": "1.2.840.10008.5.1.4.1.1.1.1",  # Digital X-Ray Image Storage - For Presentation
    "CR": "1.2.840.10008.5.1.4.1.1.1",  # Computed Radiography Image Storage
    "CT": "1.2.840.10008.5.1.4.1.1.2",  # CT Image Storage
}


def chest_phantom(rows: int = 512, cols: int = 448, seed: int = 0) -> np.ndarray:
    """A float64 film in [0, 1] (1 = bone white), shape (rows, cols). Deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:rows, 0:cols].astype(np.float64)
    y, x = y / rows, x / cols
    jitter = rng.uniform(-0.02, 0.02, size=6)

    def ellipse(cy, cx, ry, rx):
        return ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1.0

    film = np.full((rows, cols), 0.04)
    film[ellipse(0.55, 0.5, 0.55, 0.47)] = 0.42  # soft tissue of the thorax
    lungs = ellipse(0.45 + jitter[0], 0.30, 0.30, 0.15) | ellipse(0.45 + jitter[1], 0.70, 0.30, 0.15)
    film[lungs] = 0.16
    film[ellipse(0.62 + jitter[2], 0.56, 0.16, 0.17 + jitter[3])] = 0.62  # heart, to the patient's left
    film[(np.abs(x - 0.5) < 0.045) & (y > 0.1)] = 0.78  # spine
    for rib in range(9):  # posterior ribs as arcs across each lung
        arc = 0.2 + rib * 0.065 + 0.05 * np.cos((x - 0.5) * np.pi * 2.2)
        film[(np.abs(y - arc) < 0.009) & lungs] += 0.22
    film[(np.abs(y - (0.17 + 0.06 * np.abs(x - 0.5))) < 0.012) & (np.abs(x - 0.5) < 0.3)] = 0.85  # clavicles
    film[(y > 0.74 + 0.04 * np.cos((x - 0.5) * 6) + jitter[4]) & ellipse(0.55, 0.5, 0.55, 0.47)] = 0.5  # diaphragm
    vessels = rng.normal(0.0, 1.0, size=(rows // 8 + 1, cols // 8 + 1))
    texture = np.kron(vessels, np.ones((8, 8)))[:rows, :cols]
    film[lungs] += 0.03 * texture[lungs]
    film += rng.normal(0.0, 0.01, size=film.shape)
    return np.clip(film, 0.0, 1.0)


def quantize(film: np.ndarray, bits: int) -> np.ndarray:
    """Map [0, 1] onto the full unsigned range of `bits` (uint8 up to 8 bits, else uint16)."""
    dtype = np.uint8 if bits <= 8 else np.uint16
    return np.round(film * (2**bits - 1)).astype(dtype)


def png_bytes(pixels: np.ndarray) -> bytes:
    """8- or 16-bit grayscale PNG carrying the synthetic label in a tEXt chunk."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", SYNTHETIC_LABEL)
    image = Image.fromarray(pixels if pixels.dtype == np.uint8 else pixels.astype(np.uint16))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


def dicom_bytes(
    stored: np.ndarray,
    *,
    bits_stored: int,
    transfer_syntax: str = "explicit-vr-little-endian",
    photometric: str = "MONOCHROME2",
    modality: str = "DX",
    view_position: str | None = "PA",
    rescale: tuple[float, float] | None = None,
    window: tuple[float, float] | None = None,
    voi_lut: tuple[np.ndarray, int] | None = None,
    patient_name: str = "Synthetic^Phantom",
    patient_id: str = "SYNTHETIC-0000",
    frames: int = 1,
    pixel_spacing_mm: float | None = None,
) -> bytes:
    """A DICOM Part 10 file of `stored` values (already MONOCHROME1 if asked), in the named transfer syntax.

    rescale: (slope, intercept). window: (center, width). voi_lut: (table, first mapped value), 16-bit entries.
    """
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import UID, generate_uid

    if transfer_syntax not in TRANSFER_SYNTAXES:
        raise ValueError(f"unknown transfer syntax {transfer_syntax!r}; choose from {sorted(TRANSFER_SYNTAXES)}")
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(SOP_CLASSES.get(modality, SOP_CLASSES["DX"]))
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = UID(UNCOMPRESSED_SYNTAXES["explicit-vr-little-endian"])
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.PatientName, ds.PatientID = patient_name, patient_id
    ds.PatientBirthDate, ds.AccessionNumber = "19000101", "SYN0001"
    ds.Modality = modality
    ds.ImageComments = ds.SeriesDescription = SYNTHETIC_LABEL
    ds.BodyPartExamined = "CHEST"
    if view_position is not None:
        ds.ViewPosition = view_position
    if pixel_spacing_mm is not None:
        ds.PixelSpacing = [f"{pixel_spacing_mm:.6g}", f"{pixel_spacing_mm:.6g}"]
    frame_stack = np.stack([stored] * frames) if frames > 1 else stored
    ds.Rows, ds.Columns = stored.shape
    if frames > 1:
        ds.NumberOfFrames = frames
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = 8 if stored.dtype == np.uint8 else 16
    ds.BitsStored, ds.HighBit = bits_stored, bits_stored - 1
    ds.PixelRepresentation = 0
    if rescale is not None:
        ds.RescaleSlope, ds.RescaleIntercept = f"{rescale[0]:g}", f"{rescale[1]:g}"
        ds.RescaleType = "US"
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = f"{window[0]:g}", f"{window[1]:g}"
    if voi_lut is not None:
        table, first = voi_lut
        item = Dataset()
        item.LUTDescriptor = [len(table), int(first), 16]
        item.LUTData = [int(v) for v in table]
        item["LUTData"].VR = "US"
        ds.VOILUTSequence = [item]
    ds.PixelData = frame_stack.tobytes()
    _encode(ds, frame_stack, transfer_syntax)
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def _encode(ds, pixels: np.ndarray, transfer_syntax: str) -> None:
    from pydicom.encaps import encapsulate
    from pydicom.uid import UID

    uid = UID(TRANSFER_SYNTAXES[transfer_syntax])
    if transfer_syntax in UNCOMPRESSED_SYNTAXES:
        ds.file_meta.TransferSyntaxUID = uid
        return
    if transfer_syntax in ("jpeg-baseline", "jpeg-lossless-sv1"):
        # pydicom has no JPEG encoder; these come from libjpeg(-turbo) through Pillow and imagecodecs.
        frames = pixels if pixels.ndim == 3 else pixels[None]
        ds.PixelData = encapsulate([_jpeg_frame(frame, transfer_syntax, int(ds.BitsStored)) for frame in frames])
        ds["PixelData"].VR = "OB"
        ds.file_meta.TransferSyntaxUID = uid
        if transfer_syntax == "jpeg-baseline":
            ds.LossyImageCompression = "01"
        return
    lossy = {"j2k_cr": [10]} if transfer_syntax == "jpeg-2000" else {}
    ds.compress(uid, pixels, generate_instance_uid=False, **lossy)
    if lossy:
        ds.LossyImageCompression = "01"


def _jpeg_frame(frame: np.ndarray, transfer_syntax: str, bits_stored: int) -> bytes:
    if transfer_syntax == "jpeg-baseline":
        if frame.dtype != np.uint8:
            raise ValueError("JPEG Baseline holds 8-bit pixels only; quantize to 8 bits first")
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="JPEG", quality=95)
        return buffer.getvalue()
    try:
        import imagecodecs
    except ImportError as exc:  # a test/tooling dependency, not needed to read films
        raise RuntimeError("writing JPEG Lossless needs imagecodecs (pip install imagecodecs)") from exc
    return bytes(imagecodecs.jpeg8_encode(frame, lossless=True, predictor=1, bitspersample=bits_stored))


def write_phantom_set(
    folder: Path, count: int, *, size: tuple[int, int] = (512, 448), start_seed: int = 0
) -> list[Path]:
    """Fill a folder with labelled synthetic films (alternating PNG and 12-bit DICOM) for demos and pipeline tests."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for index in range(count):
        film = chest_phantom(*size, seed=start_seed + index)
        if index % 2:
            path = folder / f"synthetic_phantom_{index:04d}.dcm"
            path.write_bytes(dicom_bytes(quantize(film, 12), bits_stored=12, window=(2048, 4096)))
        else:
            path = folder / f"synthetic_phantom_{index:04d}.png"
            path.write_bytes(png_bytes(quantize(film, 8)))
        written.append(path)
    return written
