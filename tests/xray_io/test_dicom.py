"""DICOM decoding with real files written by pydicom: pixel values and ranges, not just 'no exception'."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

from medgemma_xray.phantoms.films import COMPRESSED_SYNTAXES, TRANSFER_SYNTAXES, chest_phantom, dicom_bytes, quantize
from medgemma_xray.xray_io import CorruptImageError, MissingCodecError, UnsupportedImageError, load_radiograph

FILM = chest_phantom(320, 288, seed=7)
LOSSY = {"jpeg-baseline": 12, "jpeg-2000": 24}  # worst 8-bit error allowed for lossy syntaxes


def reference_8bit(stored: np.ndarray) -> np.ndarray:
    """What a correct reader must produce for full-range data with no LUTs: a min-max stretch."""
    values = stored.astype(np.float64)
    return np.round((values - values.min()) / (values.max() - values.min()) * 255)


@pytest.mark.parametrize("bits", [8, 12, 16])
@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_bit_depths_and_photometric(bits, photometric):
    stored = quantize(FILM, bits)
    if photometric == "MONOCHROME1":  # the detector writes bone dark; the reader must flip it back
        stored = (2**bits - 1 - stored.astype(np.int64)).astype(stored.dtype)
    film = load_radiograph(dicom_bytes(stored, bits_stored=bits, photometric=photometric))
    expected = reference_8bit(quantize(FILM, bits))
    assert film.pixels.dtype == np.uint8 and film.pixels.shape == (320, 288)
    assert film.pixels.min() == 0 and film.pixels.max() == 255
    assert np.abs(film.pixels.astype(int) - expected).max() <= 1
    assert (photometric == "MONOCHROME1") == any("inverted" in w for w in film.warnings)
    # bone (spine) brighter than lung in the output, whatever the input convention
    assert film.pixels[200, 144] > film.pixels[140, 80]


@pytest.mark.parametrize("syntax", sorted(TRANSFER_SYNTAXES))
def test_every_claimed_transfer_syntax(syntax):
    bits = 8 if syntax == "jpeg-baseline" else 12
    stored = quantize(FILM, bits)
    film = load_radiograph(dicom_bytes(stored, bits_stored=bits, transfer_syntax=syntax))
    error = np.abs(film.pixels.astype(int) - reference_8bit(stored)).max()
    assert error <= LOSSY.get(syntax, 1), f"{syntax}: max error {error} grey levels"
    assert film.source.startswith("DICOM DX")


def test_rescale_slope_intercept_through_modality_lut():
    # Stored 0..1023 with slope 4, intercept -1000 -> modality values -1000..3092; window keeps 0..2000.
    stored = quantize(FILM, 10)
    window = (1000.0, 2001.0)
    data = dicom_bytes(stored, bits_stored=10, rescale=(4, -1000), window=window)
    film = load_radiograph(data)
    modality = stored.astype(np.float64) * 4 - 1000
    low, high = window[0] - 0.5 - (window[1] - 1) / 2, window[0] - 0.5 + (window[1] - 1) / 2
    clipped = np.clip(modality, low, high)
    expected = np.round((clipped - clipped.min()) / (clipped.max() - clipped.min()) * 255)
    assert np.abs(film.pixels.astype(int) - expected).max() <= 1
    assert (film.pixels == 0).mean() > 0.05 and (film.pixels == 255).mean() > 0.01  # both ends clipped


def test_window_narrows_the_displayed_range():
    stored = quantize(FILM, 12)
    wide = load_radiograph(dicom_bytes(stored, bits_stored=12, window=(2048, 4096)))
    narrow = load_radiograph(dicom_bytes(stored, bits_stored=12, window=(1200, 800)))
    assert (narrow.pixels == 255).mean() > (wide.pixels == 255).mean() + 0.1
    assert not any("No VOI LUT" in warning for warning in narrow.warnings)


def test_voi_lut_sequence_is_applied():
    stored = quantize(FILM, 12)
    table = (4095 - np.arange(4096)) * 16  # an inverting LUT: proves the table, not a window, was used
    film = load_radiograph(dicom_bytes(stored, bits_stored=12, voi_lut=(table, 0)))
    assert np.abs(film.pixels.astype(int) - (255 - reference_8bit(stored))).max() <= 1


def test_ct_is_rejected_by_modality():
    with pytest.raises(UnsupportedImageError, match="modality is CT.*CR, DX or DR"):
        load_radiograph(dicom_bytes(quantize(FILM, 12), bits_stored=12, modality="CT"))


def test_truncated_file_gives_a_clear_error():
    data = dicom_bytes(quantize(FILM, 12), bits_stored=12)
    with pytest.raises(CorruptImageError, match="truncated"):
        load_radiograph(data[: len(data) // 2])


def test_multi_frame_is_rejected_by_name():
    with pytest.raises(UnsupportedImageError, match=r"Multi-frame DICOM \(3 frames\)"):
        load_radiograph(dicom_bytes(quantize(FILM, 12), bits_stored=12, frames=3))


def test_view_other_than_pa_warns_but_loads():
    film = load_radiograph(dicom_bytes(quantize(FILM, 12), bits_stored=12, view_position="AP"))
    assert film.view_position == "AP"
    assert any("AP, not PA" in warning for warning in film.warnings)
    pa = load_radiograph(dicom_bytes(quantize(FILM, 12), bits_stored=12, view_position="PA"))
    assert not any("PA chest films" in warning for warning in pa.warnings)


def test_dicom_is_recognised_by_content_not_extension(tmp_path):
    path = tmp_path / "no_extension"
    path.write_bytes(dicom_bytes(quantize(FILM, 12), bits_stored=12))
    assert load_radiograph(path).source.startswith("DICOM")


def test_no_patient_identifiers_in_logs(caplog):
    caplog.set_level(logging.DEBUG)
    data = dicom_bytes(quantize(FILM, 12), bits_stored=12, patient_name="Sentinel^Person", patient_id="PID-SENTINEL-42")
    load_radiograph(data)
    with pytest.raises(UnsupportedImageError):
        load_radiograph(dicom_bytes(quantize(FILM, 12), bits_stored=12, modality="MR", patient_id="PID-SENTINEL-42"))
    assert "decoded DICOM" in caplog.text
    for identifier in ("Sentinel", "PID-SENTINEL-42", "19000101", "SYN0001"):
        assert identifier not in caplog.text


@pytest.mark.parametrize(
    "syntax,package", [("jpeg-2000-lossless", "pylibjpeg-openjpeg"), ("jpeg-ls-lossless", "pyjpegls")]
)
def test_missing_codec_names_the_package(tmp_path, syntax, package):
    path = tmp_path / "film.dcm"
    path.write_bytes(dicom_bytes(quantize(FILM, 12), bits_stored=12, transfer_syntax=syntax))
    # A fresh interpreter whose pydicom decoder has no plugins left: what a host without the package sees.
    script = (
        "from pydicom.pixels import get_decoder\n"
        "from pydicom.uid import UID\n"
        f"decoder = get_decoder(UID({TRANSFER_SYNTAXES[syntax]!r}))\n"
        "for label in list(decoder._available) + list(decoder._unavailable):\n"
        "    decoder.remove_plugin(label)\n"
        "from medgemma_xray.xray_io import load_radiograph, MissingCodecError\n"
        f"try:\n    load_radiograph({str(path)!r})\nexcept MissingCodecError as e:\n    print('MISSING:', e)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "MISSING:" in result.stdout, result.stderr[-2000:]
    assert f"pip install {package}" in result.stdout
    assert MissingCodecError.__name__ in script


def test_compressed_syntaxes_are_really_compressed():
    raw = len(dicom_bytes(quantize(FILM, 12), bits_stored=12))
    for syntax in COMPRESSED_SYNTAXES:
        bits = 8 if syntax == "jpeg-baseline" else 12
        assert len(dicom_bytes(quantize(FILM, bits), bits_stored=bits, transfer_syntax=syntax)) < raw, syntax
