"""Hostile and damaged films: each refused (or read) with the package's own error and a message that says what to
do, bombs refused from the header, peak memory bounded, no file name in any message."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize
from medgemma_xray.xray_io import CorruptImageError, ImageInputError, UnsupportedImageError, load_radiograph

FILM = chest_phantom(240, 200, seed=5)


def with_tags(data: bytes, **tags) -> bytes:
    """Rewrite DICOM tags as a careless or hostile writer would: None deletes, (VR, value) writes raw text under
    another VR (so an implicit-VR file carries, say, 'abc' where a number belongs)."""
    import pydicom
    from pydicom import config

    dataset = pydicom.dcmread(io.BytesIO(data))
    saved = config.settings.writing_validation_mode
    config.settings.writing_validation_mode = config.IGNORE
    try:
        for keyword, value in tags.items():
            if value is None:
                delattr(dataset, keyword)
            elif isinstance(value, tuple):
                from pydicom.datadict import tag_for_keyword

                dataset.add_new(tag_for_keyword(keyword), *value)
            else:
                setattr(dataset, keyword, value)
        buffer = io.BytesIO()
        dataset.save_as(buffer, enforce_file_format=True)
    finally:
        config.settings.writing_validation_mode = saved
    return buffer.getvalue()


def windowed_dicom(**kwargs) -> bytes:
    return dicom_bytes(quantize(FILM, 12), bits_stored=12, window=(2048, 4096), **kwargs)


def test_window_width_zero_falls_back_to_the_full_range_with_a_warning():
    film = load_radiograph(with_tags(windowed_dicom(), WindowWidth="0"))
    full_range = load_radiograph(dicom_bytes(quantize(FILM, 12), bits_stored=12))
    assert np.array_equal(film.pixels, full_range.pixels)
    assert any("Window Width of 0" in warning for warning in film.warnings)


def test_rescale_slope_that_is_not_a_number_is_refused_by_name():
    data = windowed_dicom(rescale=(2, 0), transfer_syntax="implicit-vr-little-endian")
    with pytest.raises(CorruptImageError, match="Rescale Slope.*(not a number|damaged).*[Ee]xport the film again"):
        load_radiograph(with_tags(data, RescaleSlope=("LO", "abc")))


def test_dicom_without_preamble_is_read_as_dicom():
    data = windowed_dicom()
    headerless = data[132:]  # no 128-byte preamble, no 'DICM': starts at the file meta group
    assert headerless[:2] == b"\x02\x00"
    film = load_radiograph(headerless)
    assert film.source.startswith("DICOM DX")
    assert np.array_equal(film.pixels, load_radiograph(data).pixels)


def test_float_pixel_data_is_named_as_such():
    import pydicom

    dataset = pydicom.dcmread(io.BytesIO(windowed_dicom()))
    del dataset.PixelData
    dataset.BitsAllocated = 32
    dataset.FloatPixelData = FILM.astype(np.float32).tobytes()
    buffer = io.BytesIO()
    dataset.save_as(buffer)
    with pytest.raises(UnsupportedImageError, match=r"floating-point pixel values \(Float Pixel Data\)"):
        load_radiograph(buffer.getvalue())


def test_missing_modality_says_it_is_missing():
    with pytest.raises(UnsupportedImageError, match="has no Modality.*with its modality set") as refused:
        load_radiograph(with_tags(windowed_dicom(), Modality=None))
    assert "series" not in str(refused.value)


def test_bits_stored_above_bits_allocated_is_a_contradiction_not_truncation():
    with pytest.raises(CorruptImageError, match=r"Bits Stored \(12\) must be between 1 and Bits Allocated \(8\)") as e:
        load_radiograph(with_tags(windowed_dicom(), BitsAllocated=8))
    assert "truncated" not in str(e.value)


@pytest.mark.parametrize(
    "photometric,shape,inverted",
    [
        ("MONOCHROME1", "INVERSE", True),
        ("MONOCHROME1", None, True),
        ("MONOCHROME2", "INVERSE", True),
        ("MONOCHROME2", "IDENTITY", False),
    ],
)
def test_inversion_happens_exactly_once(photometric, shape, inverted):
    """DX files pair MONOCHROME1 with Presentation LUT Shape INVERSE; both say 'low values are white'."""
    stored = quantize(FILM, 12)
    bone_dark = (4095 - stored.astype(np.int64)).astype(np.uint16)
    data = dicom_bytes(stored if not inverted else bone_dark, bits_stored=12, photometric=photometric)
    if shape is not None:
        data = with_tags(data, PresentationLUTShape=shape)
    film = load_radiograph(data)
    reference = load_radiograph(dicom_bytes(stored, bits_stored=12)).pixels  # bone white, no inversion asked
    assert np.abs(film.pixels.astype(int) - reference).max() <= 1
    assert film.pixels[150, 100] > film.pixels[110, 50]  # spine brighter than lung
    assert sum("inverted" in warning for warning in film.warnings) == (1 if inverted else 0)


def test_exif_orientation_is_applied():
    from PIL import Image

    stored = quantize(FILM, 8)  # 240 rows x 200 columns, as the camera's sensor wrote it
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    buffer = io.BytesIO()
    Image.fromarray(stored).save(buffer, format="JPEG", quality=98, exif=exif)
    film = load_radiograph(buffer.getvalue())
    upright = np.rot90(stored, k=-1)
    assert film.shape == upright.shape == (200, 240)
    assert np.abs(film.pixels.astype(int) - upright).mean() < 2
    assert any("EXIF orientation" in warning for warning in film.warnings)


def test_messages_and_logs_never_carry_the_file_name(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    secret = "ZZTESTPATIENT_SECRETNAME_PID-7731"
    cases = {
        "ct": dicom_bytes(quantize(FILM, 12), bits_stored=12, modality="CT"),
        "text": b"not an image at all",
        "truncated": windowed_dicom()[:3000],
        "png": png_bytes(quantize(FILM, 8))[:500],
    }
    for label, data in cases.items():
        path = tmp_path / f"{secret}_{label}.dcm"
        path.write_bytes(data)
        with pytest.raises(ImageInputError) as refused:
            load_radiograph(path)
        assert secret not in str(refused.value) and "ZZTEST" not in str(refused.value)
    with pytest.raises(UnsupportedImageError, match="not found") as missing:
        load_radiograph(tmp_path / f"{secret}.png")
    assert secret not in str(missing.value)
    assert secret not in caplog.text


def test_png_and_jpeg_modes_are_kept_or_refused_by_name():
    from PIL import Image

    rgba = Image.fromarray(np.repeat(quantize(FILM, 8)[:, :, None], 4, axis=2), mode="RGBA")
    buffer = io.BytesIO()
    rgba.save(buffer, format="PNG")
    film = load_radiograph(buffer.getvalue())
    assert film.source == "PNG 8-bit colour" and np.array_equal(film.pixels, quantize(FILM, 8))
    gif = io.BytesIO()
    Image.fromarray(quantize(FILM, 8)).save(gif, format="GIF")
    with pytest.raises(UnsupportedImageError, match="GIF images are not supported; convert the film to PNG"):
        load_radiograph(gif.getvalue())
