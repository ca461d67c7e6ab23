"""Fuzzing the loader with hypothesis: damaged bytes and hostile header values must end in a Radiograph or in one
of the package's own errors, and never in the loader's last-line catch-all (UnexpectedImageError), which would mean
a failure no check anticipated. Fixed seed (derandomize) and a bounded example count keep CI repeatable and short;
FUZZ_EXAMPLES=5000 runs a longer search locally.
"""

from __future__ import annotations

import functools
import io
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, png_bytes, quantize
from medgemma_xray.xray_io import ImageInputError, Radiograph, load_radiograph
from medgemma_xray.xray_io.errors import UnexpectedImageError

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "250"))
pytestmark = pytest.mark.timeout(max(120, EXAMPLES // 10))  # about 25 ms an example here: a hard stop in CI
FUZZ = settings(
    max_examples=EXAMPLES, derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@functools.cache
def seed_files() -> dict[str, bytes]:
    """One small valid file of every kind the loader reads."""
    from PIL import Image

    film = chest_phantom(80, 72, seed=9)
    jpeg, exif_jpeg = io.BytesIO(), io.BytesIO()
    Image.fromarray(quantize(film, 8)).save(jpeg, format="JPEG")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(quantize(film, 8)).save(exif_jpeg, format="JPEG", exif=exif)
    files = {
        "png8": png_bytes(quantize(film, 8)),
        "png16": png_bytes(quantize(film, 16)),
        "jpeg": jpeg.getvalue(),
        "jpeg-exif": exif_jpeg.getvalue(),
    }
    for syntax in (
        "explicit-vr-little-endian",
        "implicit-vr-little-endian",
        "deflated-explicit-vr-little-endian",
        "rle-lossless",
        "jpeg-ls-lossless",
        "jpeg-2000-lossless",
        "jpeg-lossless-sv1",
    ):
        files[syntax] = dicom_bytes(quantize(film, 12), bits_stored=12, window=(2048, 4096), transfer_syntax=syntax)
    files["no-preamble"] = files["explicit-vr-little-endian"][132:]
    return files


def assert_loads_or_refuses_cleanly(data: bytes) -> None:
    try:
        film = load_radiograph(data)
    except UnexpectedImageError as exc:
        raise AssertionError(f"the loader's catch-all fired: {type(exc.__cause__).__name__}: {exc.__cause__}") from exc
    except ImageInputError as exc:
        assert str(exc) and "Traceback" not in str(exc)
        return
    assert isinstance(film, Radiograph) and film.pixels.dtype == np.uint8 and film.pixels.ndim == 2


@FUZZ
@given(
    kind=st.sampled_from(sorted(seed_files())),
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=12),
    cut=st.none() | st.floats(0.05, 1.0),
)
def test_damaged_bytes_never_escape_the_package_errors(kind, edits, cut):
    data = bytearray(seed_files()[kind])
    for where, value in edits:
        data[int(where * len(data))] = value
    if cut is not None:
        data = data[: max(1, int(cut * len(data)))]
    assert_loads_or_refuses_cleanly(bytes(data))


HEADER_VALUES = {
    "Rows": st.sampled_from([0, 1, 63, 80, 81, 65535]),
    "Columns": st.sampled_from([0, 1, 72, 71, 65535]),
    "BitsAllocated": st.sampled_from([0, 1, 8, 12, 16, 32, 64]),
    "BitsStored": st.sampled_from([0, 1, 8, 12, 16, 17, 32]),
    "HighBit": st.sampled_from([0, 7, 11, 15, 31]),
    "PixelRepresentation": st.sampled_from([0, 1, 2]),
    "SamplesPerPixel": st.sampled_from([0, 1, 3]),
    "NumberOfFrames": st.sampled_from(["0", "1", "2", "-1", "999999999"]),
    "PhotometricInterpretation": st.sampled_from(["MONOCHROME1", "MONOCHROME2", "RGB", "PALETTE COLOR", ""]),
    "Modality": st.sampled_from(["DX", "CR", "CT", "", "XA"]),
    "WindowCenter": st.sampled_from(["0", "2048", "-1e308", "1e308", "nan"]),
    "WindowWidth": st.sampled_from(["0", "-5", "1", "4096", "1e-300", "inf"]),
    "RescaleSlope": st.sampled_from(["0", "1", "-1", "1e308", "1e-308", "nan"]),
    "RescaleIntercept": st.sampled_from(["0", "-1024", "1e308", "-inf"]),
    "PresentationLUTShape": st.sampled_from(["IDENTITY", "INVERSE", "BOGUS"]),
    "VOILUTFunction": st.sampled_from(["LINEAR", "SIGMOID", "LINEAR_EXACT", "BOGUS"]),
}


@FUZZ
@given(
    syntax=st.sampled_from(["explicit-vr-little-endian", "rle-lossless", "jpeg-2000-lossless"]),
    changes=st.dictionaries(st.sampled_from(sorted(HEADER_VALUES)), st.none(), min_size=1, max_size=5).flatmap(
        lambda keys: st.fixed_dictionaries({key: HEADER_VALUES[key] for key in keys})
    ),
)
def test_hostile_header_values_never_escape_the_package_errors(syntax, changes):
    import pydicom
    from pydicom import config

    dataset = pydicom.dcmread(io.BytesIO(seed_files()[syntax]))
    saved = config.settings.writing_validation_mode
    config.settings.writing_validation_mode = config.IGNORE
    try:
        for keyword, value in changes.items():
            setattr(dataset, keyword, value)
        buffer = io.BytesIO()
        dataset.save_as(buffer, enforce_file_format=True)
    finally:
        config.settings.writing_validation_mode = saved
    assert_loads_or_refuses_cleanly(buffer.getvalue())
