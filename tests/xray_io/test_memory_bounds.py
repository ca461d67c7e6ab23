"""Image bombs are refused from the header, and one film's peak memory stays a small multiple of its pixels.

Memory is read from a child process (its peak RSS, reset just before the load), because Pillow's and the codecs'
buffers live outside Python's allocator where tracemalloc cannot see them. The child runs under an address-space
limit, so a loader that does decode a bomb fails with MemoryError instead of taking this machine's memory.
"""

from __future__ import annotations

import functools
import io
import json
import resource
import subprocess
import sys

import pytest

from devtools.hostile_files import dicom_deflated_bomb, dicom_rle_bomb, png_bomb
from devtools.phantoms import chest_phantom, dicom_bytes, png_bytes, quantize
from tests.conftest import REPO_ROOT

ADDRESS_SPACE_LIMIT = 3 << 30
PEAK_MULTIPLE = 5  # peak extra memory for one film, in units of its stored pixel bytes
BOMB_PEAK_BYTES = 48 << 20  # refusing a bomb from its header costs next to nothing

CHILD = r"""
import json, sys
from xray_io import ImageInputError, load_radiograph

def rss(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))

try:  # pay for imports and codec plugins first, on a small film of the same kind
    load_radiograph(open(sys.argv[2], "rb").read())
except ImageInputError:
    pass
data = open(sys.argv[1], "rb").read()
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # resets the peak (VmHWM) to the current RSS
before = rss("VmRSS:")
try:
    film = load_radiograph(data)
    outcome = {"loaded": list(film.shape)}
except ImageInputError as exc:
    outcome = {"refused": type(exc).__name__, "message": str(exc)}
outcome["peak_bytes"] = rss("VmHWM:") - before
print(json.dumps(outcome))
"""


def limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def load_in_child(tmp_path, data: bytes, warm_up: bytes) -> dict:
    film, warm = tmp_path / "film", tmp_path / "warm"
    film.write_bytes(data)
    warm.write_bytes(warm_up)
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(film), str(warm)], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=300, preexec_fn=limit_address_space, env={"PYTHONPATH": str(REPO_ROOT), "OPENBLAS_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


SMALL = chest_phantom(128, 112, seed=1)  # cheap: built at import
BOMBS = {  # name: (builder, what its decoder would need)
    "png-16bit-13000x13000": (lambda: png_bomb(13000, 13000, 16), "338 MB of pixels (4.2 GB peak before)"),
    "png-8bit-30000x30000": (lambda: png_bomb(30000, 30000, 8), "900 MB; Pillow's own bomb error"),
    "dicom-deflated-16000x16000": (lambda: dicom_deflated_bomb(16000, 16000), "512 MB inflated (7.3 GB peak)"),
    "dicom-rle-20000x20000": (lambda: dicom_rle_bomb(20000, 20000), "800 MB decoded (9.9 GB peak)"),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bombs_are_refused_from_the_header(tmp_path, name):
    build, _expands_to = BOMBS[name]
    data = build()
    assert len(data) < 16 << 20
    warm = png_bytes(quantize(SMALL, 8)) if name.startswith("png") else dicom_bytes(quantize(SMALL, 12), bits_stored=12)
    outcome = load_in_child(tmp_path, data, warm)
    assert outcome.get("refused") == "ImageTooLargeError", outcome
    assert "the limit is 40 Mpx" in outcome["message"] and "Export the film" in outcome["message"]
    assert outcome["peak_bytes"] < BOMB_PEAK_BYTES, f"{outcome['peak_bytes'] >> 20} MiB to refuse {name}"


@functools.cache
def large_film(bits: int):
    return quantize(_large_phantom(), bits)


@functools.cache
def _large_phantom():
    return chest_phantom(3000, 2500, seed=2)  # a real detector size: 7.5 Mpx


def _jpeg(pixels) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


FILMS = {  # name: (file, stored bytes per pixel, a small file of the same kind to warm up on)
    "dicom-16bit-explicit": (lambda: dicom_bytes(large_film(16), bits_stored=16, window=(30000, 60000)), 2,
                             lambda: dicom_bytes(quantize(SMALL, 16), bits_stored=16, window=(30000, 60000))),
    "dicom-12bit-rle-rescaled": (
        lambda: dicom_bytes(large_film(12), bits_stored=12, transfer_syntax="rle-lossless", rescale=(2, -100)), 2,
        lambda: dicom_bytes(quantize(SMALL, 12), bits_stored=12, transfer_syntax="rle-lossless", rescale=(2, -100))),
    "dicom-12bit-deflated": (
        lambda: dicom_bytes(large_film(12), bits_stored=12, transfer_syntax="deflated-explicit-vr-little-endian"),
        2, lambda: dicom_bytes(quantize(SMALL, 12), bits_stored=12,
                               transfer_syntax="deflated-explicit-vr-little-endian")),
    "png-16bit": (lambda: png_bytes(large_film(16)), 2, lambda: png_bytes(quantize(SMALL, 16))),
    "jpeg-8bit": (lambda: _jpeg(large_film(8)), 1, lambda: _jpeg(quantize(SMALL, 8))),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FILMS))
def test_peak_memory_for_one_film_is_a_small_multiple_of_its_pixels(tmp_path, name):
    build, bytes_per_pixel, warm = FILMS[name]
    outcome = load_in_child(tmp_path, build(), warm())
    assert outcome.get("loaded") == [3000, 2500], outcome
    pixel_bytes = 3000 * 2500 * bytes_per_pixel
    multiple = outcome["peak_bytes"] / pixel_bytes
    assert multiple <= PEAK_MULTIPLE, f"{name}: peak {outcome['peak_bytes'] >> 20} MiB = {multiple:.1f}x its pixels"
