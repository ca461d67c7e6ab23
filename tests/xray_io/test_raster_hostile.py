"""Hostile raster input: a progressive JPEG made of thousands of empty scans is refused
from its markers before decoding; a PNG whose zTXt chunk is a bomb is named as such (not "header damaged"); a
phone's MPO JPEG is read from its first image."""

from __future__ import annotations

import io
import sys
import time

import numpy as np
import pytest

from devtools.hostile_files import phone_mpo, png_ztxt_bomb, progressive_jpeg_scan_bomb
from medgemma_xray.xray_io import UnsupportedImageError, load_radiograph
from medgemma_xray.xray_io.errors import ImageTooLargeError


def pillow_decodes_during(action) -> list[str]:
    """The Pillow decoder calls made while `action` runs, seen through the interpreter's profiling hook: what
    shows the refusal came before decoding on any machine, where a time bound shows it only on a slow one."""
    seen: list[str] = []

    def watch(frame, event, arg) -> None:
        code = frame.f_code
        if event == "call" and code.co_name in ("load", "decode") and "PIL" in code.co_filename:
            seen.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}")

    sys.setprofile(watch)
    try:
        action()
    finally:
        sys.setprofile(None)
    return seen


def test_a_progressive_jpeg_scan_bomb_is_refused_within_a_second():
    # 30,000 empty scans: Pillow 12.3 decodes them in about 2 CPU-seconds on this project's machine (2026-12-02)
    bomb = progressive_jpeg_scan_bomb(1024, 30_000)
    started = time.thread_time()  # this thread's CPU: the decoder would run here, and load elsewhere cannot stretch it

    def load() -> None:
        with pytest.raises(UnsupportedImageError, match="more than 100 scans.*refused before decoding"):
            load_radiograph(bomb)

    assert pillow_decodes_during(load) == []  # refused from its markers, up front
    assert time.thread_time() - started < 1.0


def test_an_ordinary_progressive_jpeg_still_loads():
    from PIL import Image

    from medgemma_xray.phantoms.films import chest_phantom, quantize

    pixels = quantize(chest_phantom(512, 448, seed=2), 8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", progressive=True, quality=95)
    film = load_radiograph(buffer.getvalue())
    assert film.shape == (512, 448)
    assert np.abs(film.pixels.astype(int) - pixels).mean() < 3


def test_a_ztxt_bomb_is_named_a_bomb_not_a_damaged_header():
    with pytest.raises(ImageTooLargeError, match="compressed text chunk.*decompression bomb.*without text metadata"):
        load_radiograph(png_ztxt_bomb())


def test_a_phone_mpo_reads_its_first_image_with_a_warning():
    film = load_radiograph(phone_mpo(256))
    assert film.shape == (256, 256)
    assert any("holds 2 images (MPO" in warning and "first was read" in warning for warning in film.warnings)
    assert film.source.startswith("JPEG")


def test_an_rle_frame_with_too_little_data_is_damage_not_a_missing_package():
    import pydicom
    from pydicom.encaps import generate_frames

    from devtools.hostile_files import _save_with_fragments
    from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize
    from medgemma_xray.xray_io import CorruptImageError

    data = dicom_bytes(quantize(chest_phantom(128, 112, seed=1), 12), bits_stored=12, transfer_syntax="rle-lossless")
    frame = bytes(next(generate_frames(pydicom.dcmread(io.BytesIO(data)).PixelData, number_of_frames=1)))
    short = _save_with_fragments(pydicom.dcmread(io.BytesIO(data)), [frame[: len(frame) // 2]])
    with pytest.raises(CorruptImageError) as refused:
        load_radiograph(short)
    assert "install" not in str(refused.value).lower()
    assert "truncated or damaged" in str(refused.value)
