"""DICOM to PNG for teaching material: the UI's windowing, and nothing that identifies the patient.

The PNG holds the 8-bit film exactly as the loader renders it for the UI (modality LUT, VOI LUT or window,
stretch, MONOCHROME1 inverted) and no metadata chunk at all: no tEXt, iTXt, zTXt or eXIf. Its name is the film's
id (films.film_id), never a DICOM value or the source file name. The record keeps only view, modality, size and
transfer syntax.
"""

from __future__ import annotations

import io
from pathlib import Path

from medgemma_xray.assistant.batch.journal import write_atomically
from medgemma_xray.xray_io import Radiograph
from medgemma_xray.xray_io.loader import is_dicom

PNG_DIR = "png"


def looks_like_dicom(path: Path) -> bool:
    with open(path, "rb") as handle:
        return is_dicom(handle.read(132))


def dicom_facts(path: Path) -> dict:
    """The non-identifying header values the index keeps. Only the header is read (stop_before_pixels)."""
    import pydicom

    dataset = pydicom.dcmread(path, stop_before_pixels=True)
    syntax = dataset.file_meta.TransferSyntaxUID
    return {"modality": str(getattr(dataset, "Modality", "") or ""), "transfer_syntax": syntax.name}


def write_png(film_id: str, radiograph: Radiograph, output_dir: Path) -> str:
    """Write png/<film_id>.png (8-bit grayscale, no metadata chunks); returns its path relative to output_dir."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(radiograph.pixels, mode="L").save(buffer, format="PNG")  # Pillow adds no text chunk unasked
    relative = f"{PNG_DIR}/{film_id}.png"
    (output_dir / PNG_DIR).mkdir(exist_ok=True)
    write_atomically(output_dir / relative, buffer.getvalue())
    return relative


def conversion_result(path: Path, film_id: str, radiograph: Radiograph, output_dir: Path) -> dict:
    facts = dicom_facts(path)
    rows, columns = radiograph.shape
    return {
        "png": write_png(film_id, radiograph, output_dir),
        "view": radiograph.view_position,
        "modality": facts["modality"],
        "rows": rows,
        "columns": columns,
        "transfer_syntax": facts["transfer_syntax"],
    }
