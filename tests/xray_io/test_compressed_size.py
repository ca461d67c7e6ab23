"""Compressed DICOM declares its size in its codestream, wherever the codestream puts it:
split over fragments, after 128 KiB of APPn segments, or after a large JP2 box. Every layout is read to its size;
a size over the limit, a size that differs from Rows x Columns, and a codestream with no size are all refused before
anything decodes. The batch CLI's dicom-to-png reads through the same loader."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import numpy as np
import pytest

from devtools.hostile_files import COMPRESSED_SIZE_TRICKS, _save_with_fragments, _small_compressed_film
from devtools.peak_memory import peak_load_memory
from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize
from medgemma_xray.xray_io import CorruptImageError, load_radiograph
from medgemma_xray.xray_io.errors import ImageTooLargeError
from tests.conftest import REPO_ROOT

TRICKS = sorted(COMPRESSED_SIZE_TRICKS)
HONEST = (112, 128)  # the small film's own width and height


@pytest.mark.parametrize("trick", TRICKS)
def test_every_layout_with_an_honest_size_still_loads(trick):
    film = load_radiograph(COMPRESSED_SIZE_TRICKS[trick](*HONEST))
    assert film.shape == (128, 112)
    assert film.pixels.min() == 0 and film.pixels.max() == 255  # stretched like any DICOM film


@pytest.mark.parametrize("trick", TRICKS)
def test_a_size_over_the_limit_is_found_and_refused(trick):
    with pytest.raises(ImageTooLargeError, match="claims 3000x2500 pixels; the limit is 2 Mpx.*refused before"):
        load_radiograph(COMPRESSED_SIZE_TRICKS[trick](3000, 2500), max_pixels=2_000_000)


@pytest.mark.parametrize("trick", TRICKS)
def test_a_size_that_differs_from_the_header_is_refused(trick):
    with pytest.raises(
        CorruptImageError, match="header says 112x128 pixels but the compressed image inside is 150x200"
    ):
        load_radiograph(COMPRESSED_SIZE_TRICKS[trick](150, 200))


def test_a_codestream_without_a_size_is_refused_not_decoded_on_trust():
    dataset, codestream = _small_compressed_film("jpeg-baseline")
    scan = codestream.index(b"\xff\xda")
    frame = codestream.index(b"\xff\xc0")
    length = int.from_bytes(codestream[frame + 2 : frame + 4], "big")
    no_frame_header = codestream[:frame] + codestream[frame + 2 + length : scan] + codestream[scan:]
    data = _save_with_fragments(dataset, [no_frame_header])
    with pytest.raises(CorruptImageError, match="declares no size.*refused rather than decoded"):
        load_radiograph(data)


def test_a_real_bomb_costs_nothing_to_refuse():
    """20000 x 20000 behind 128 KiB of APPn: before, the decoder was asked for 400 Mpx."""
    bomb = COMPRESSED_SIZE_TRICKS["jpeg-after-128KiB-of-APPn"](20000, 20000)
    warm = dicom_bytes(quantize(chest_phantom(128, 112, seed=1), 12), bits_stored=12)
    outcome = peak_load_memory(bomb, warm, address_space_limit=3 << 30)
    assert outcome.get("refused") == "ImageTooLargeError", outcome
    assert outcome["peak_bytes"] < 48 << 20, outcome


def test_batch_dicom_to_png_refuses_the_same_files(tmp_path):
    films, out = tmp_path / "films", tmp_path / "out"
    films.mkdir()
    for index, trick in enumerate(TRICKS):
        (films / f"bomb-{index}.dcm").write_bytes(COMPRESSED_SIZE_TRICKS[trick](20000, 20000))
    honest = dicom_bytes(quantize(chest_phantom(128, 112, seed=4), 12), bits_stored=12)
    (films / "honest.dcm").write_bytes(honest)

    def limit() -> None:  # the old loader decoded these: keep such a failure off this machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    command = [sys.executable, "batch_films.py", "--task", "dicom-to-png", "--input", str(films), "--output", str(out)]
    result = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, preexec_fn=limit, check=False
    )
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert result.returncode == 1, result.stderr[-2000:]
    refused = [r for r in records if r["status"] == "error"]
    assert len(refused) == len(TRICKS), records
    assert all("claims 20000x20000 pixels" in r["error"]["message"] for r in refused), refused
    assert [r["status"] for r in records if r["status"] == "ok"] == ["ok"]
    assert len(list((out / "png").iterdir())) == 1


def test_honest_multi_fragment_jpeg_equals_the_single_fragment_one():
    dataset, codestream = _small_compressed_film("jpeg-baseline")
    whole = load_radiograph(_save_with_fragments(dataset, [codestream]))
    dataset, codestream = _small_compressed_film("jpeg-baseline")
    split = load_radiograph(_save_with_fragments(dataset, [codestream[:2], codestream[2:1000], codestream[1000:]]))
    assert np.array_equal(whole.pixels, split.pixels)
