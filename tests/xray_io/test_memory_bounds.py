"""Image bombs are refused from the header, and one film's peak memory stays a small multiple of its pixels.

Memory is the peak RSS of a child process (devtools.peak_memory), under an address-space limit so that a loader
that does decode a bomb fails there instead of taking this machine's memory.
"""

from __future__ import annotations

import functools
import io

import pytest

from devtools.hostile_files import dicom_deflated_bomb, dicom_jpeg_with_lying_size, dicom_rle_bomb, png_bomb
from devtools.peak_memory import peak_load_memory
from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize

ADDRESS_SPACE_LIMIT = 3 << 30
PEAK_MULTIPLE = 5  # peak extra memory for one film, in units of its stored pixel bytes
BOMB_PEAK_BYTES = 48 << 20  # refusing a bomb from its header costs next to nothing


def load_in_child(data: bytes, warm_up: bytes) -> dict:
    return peak_load_memory(data, warm_up, address_space_limit=ADDRESS_SPACE_LIMIT)


SMALL = chest_phantom(128, 112, seed=1)  # cheap: built at import
BOMBS = {  # name: (builder, what its decoder would need)
    "png-16bit-13000x13000": (lambda: png_bomb(13000, 13000, 16), "338 MB of pixels (4.2 GB peak before)"),
    "png-8bit-30000x30000": (lambda: png_bomb(30000, 30000, 8), "900 MB; Pillow's own bomb error"),
    "dicom-deflated-16000x16000": (lambda: dicom_deflated_bomb(16000, 16000), "512 MB inflated (7.3 GB peak)"),
    "dicom-rle-20000x20000": (lambda: dicom_rle_bomb(20000, 20000), "800 MB decoded (9.9 GB peak)"),
    "dicom-jpeg-claiming-60000x60000": (dicom_jpeg_with_lying_size, "3.6 Gpx under a 128x112 header"),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bombs_are_refused_from_the_header(name):
    build, _expands_to = BOMBS[name]
    data = build()
    assert len(data) < 16 << 20
    warm = png_bytes(quantize(SMALL, 8)) if name.startswith("png") else dicom_bytes(quantize(SMALL, 12), bits_stored=12)
    outcome = load_in_child(data, warm)
    assert outcome.get("refused") == "ImageTooLargeError", outcome
    assert "the limit is 40 Mpx" in outcome["message"] and "Export the film" in outcome["message"]
    assert "refused before" in outcome["message"]
    assert outcome["peak_bytes"] < BOMB_PEAK_BYTES, f"{outcome['peak_bytes'] >> 20} MiB to refuse {name}"


@functools.cache
def large_film(bits: int):
    return quantize(_large_phantom(), bits)


@functools.cache
def _large_phantom():
    return chest_phantom(2400, 2000, seed=2)  # a real detector size (24 x 20 cm at 0.1 mm): 4.8 Mpx


def _jpeg(pixels) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


FILMS = {  # name: (file, stored bytes per pixel, a small file of the same kind to warm up on)
    "dicom-16bit-explicit": (
        lambda: dicom_bytes(large_film(16), bits_stored=16, window=(30000, 60000)),
        2,
        lambda: dicom_bytes(quantize(SMALL, 16), bits_stored=16, window=(30000, 60000)),
    ),
    "dicom-12bit-rle-rescaled": (
        lambda: dicom_bytes(large_film(12), bits_stored=12, transfer_syntax="rle-lossless", rescale=(2, -100)),
        2,
        lambda: dicom_bytes(quantize(SMALL, 12), bits_stored=12, transfer_syntax="rle-lossless", rescale=(2, -100)),
    ),
    "dicom-12bit-deflated": (
        lambda: dicom_bytes(large_film(12), bits_stored=12, transfer_syntax="deflated-explicit-vr-little-endian"),
        2,
        lambda: dicom_bytes(quantize(SMALL, 12), bits_stored=12, transfer_syntax="deflated-explicit-vr-little-endian"),
    ),
    "png-16bit": (lambda: png_bytes(large_film(16)), 2, lambda: png_bytes(quantize(SMALL, 16))),
    "jpeg-8bit": (lambda: _jpeg(large_film(8)), 1, lambda: _jpeg(quantize(SMALL, 8))),
}


@pytest.mark.parametrize("name", sorted(FILMS))
def test_peak_memory_for_one_film_is_a_small_multiple_of_its_pixels(name):
    build, bytes_per_pixel, warm = FILMS[name]
    outcome = load_in_child(build(), warm())
    assert outcome.get("loaded") == [2400, 2000], outcome
    pixel_bytes = 2400 * 2000 * bytes_per_pixel
    multiple = outcome["peak_bytes"] / pixel_bytes
    assert multiple <= PEAK_MULTIPLE, f"{name}: peak {outcome['peak_bytes'] >> 20} MiB = {multiple:.1f}x its pixels"
