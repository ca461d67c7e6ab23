"""The progressive-JPEG scan counter cannot be walked around: fill bytes and COM segments before the scans, a
damaged byte, or the DICOM wrapper. Every such bomb is refused from its markers, before any decoder runs."""

from __future__ import annotations

import io

import pytest

from devtools.hostile_files import before_first_scan, dicom_progressive_jpeg_scan_bomb, progressive_jpeg_scan_bomb
from medgemma_xray.xray_io import UnsupportedImageError, load_radiograph
from medgemma_xray.xray_io.codestream import Bytes, Fragments, count_jpeg_scans
from medgemma_xray.xray_io.raster import MAX_JPEG_SCANS
from tests.xray_io.test_raster_hostile import pillow_decodes_during

SCANS = 10_000
REFUSED = f"more than {MAX_JPEG_SCANS} scans.*refused before decoding"


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return progressive_jpeg_scan_bomb(512, SCANS)


@pytest.mark.parametrize(
    "padding",
    [b"\xff" * 30_000, b"\xff\xfe\x00\x02" * 20_200, b"\x00\x17" + b"\xff" * 40],
    ids=["30k-fill-bytes", "20k-empty-COM-segments", "damaged-bytes"],
)
def test_padding_before_the_scans_does_not_hide_them(bomb, padding):
    hidden = before_first_scan(bomb, padding)
    assert count_jpeg_scans(Bytes(hidden)) >= SCANS

    def load() -> None:
        with pytest.raises(UnsupportedImageError, match=REFUSED):
            load_radiograph(hidden)

    assert pillow_decodes_during(load) == []


def test_a_progressive_jpeg_inside_a_dicom_is_counted_across_its_fragments():
    import pydicom

    data = dicom_progressive_jpeg_scan_bomb(SCANS)
    fragments = Fragments.of_pixel_data(pydicom.dcmread(io.BytesIO(data)).PixelData)
    assert fragments is not None and count_jpeg_scans(fragments) >= SCANS
    with pytest.raises(UnsupportedImageError, match=REFUSED):
        load_radiograph(data)


def test_a_pair_split_by_a_fragment_seam_or_a_read_chunk_still_counts():
    from medgemma_xray.xray_io import codestream

    codestream_bytes = b"\xff\xd8" + b"\x00" * (codestream._COUNT_CHUNK - 3) + b"\xff\xda\x00\x00" + b"\xff\xd9"
    assert count_jpeg_scans(Bytes(codestream_bytes)) == 1  # the pair straddles the first read chunk's end
    seam = codestream_bytes.index(b"\xff\xda") + 1
    items = b"".join(
        b"\xfe\xff\x00\xe0" + len(part).to_bytes(4, "little") + part
        for part in (b"", codestream_bytes[:seam], codestream_bytes[seam:])
    )
    fragments = Fragments.of_pixel_data(items)
    assert fragments is not None and count_jpeg_scans(fragments) == 1


def test_ordinary_jpegs_count_their_real_scans():
    from PIL import Image

    from medgemma_xray.phantoms.films import chest_phantom, quantize

    pixels = quantize(chest_phantom(256, 256, seed=4), 8)
    for progressive, at_least, at_most in ((False, 1, 1), (True, 2, 12)):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", progressive=progressive, quality=90)
        assert at_least <= count_jpeg_scans(Bytes(buffer.getvalue())) <= at_most
        assert load_radiograph(buffer.getvalue()).shape == (256, 256)
