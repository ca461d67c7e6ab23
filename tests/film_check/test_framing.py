"""medgemma_xray.film_check.framing through the real intake: what residents upload is read as the film it is.

A phantom in a white border or inside a viewer's screenshot is cut out and read with a warning; a burned-in marker
is blanked in the model's copy (the model read "L PORTABLE AP" as a left pneumothorax) with a warning; an
inverted film is refused with the reason and the fix (and, under FILM_CHECK=warn, read with that warning), never
read silently; a clean film gets no warning; non-films stay refused at every stage.
"""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.film_check.framing import CROPPED, INVERTED, MARKER, find_film, marker_box
from medgemma_xray.film_check.negatives import NEGATIVE_KINDS, negative_film
from medgemma_xray.film_check.variants import VARIANT_KINDS, variant_png
from medgemma_xray.intake import FilmIntake, IntakeConfig, NotAChestFilm
from medgemma_xray.phantoms.films import png_bytes, quantize
from medgemma_xray.phantoms.labelled import labelled_phantom

REFUSE = FilmIntake(IntakeConfig(film_check="refuse", cache_bytes=0))
SEEDS = (970_001, 970_002, 970_003)  # held out: apart from the benchmark's and the reference's seeds


def _film(seed: int) -> np.ndarray:
    return quantize(labelled_phantom(seed, 384).film, 8)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_clean_film_is_read_without_a_framing_warning(seed):
    film = REFUSE.read(png_bytes(_film(seed)))
    assert not {CROPPED, MARKER} & set(film.warnings), film.warnings


@pytest.mark.parametrize("kind", ["padded", "screenshot"])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_border_or_a_viewers_frame_is_cut_away_and_said(kind, seed):
    film = _film(seed)
    read = REFUSE.read(variant_png(kind, film, seed))
    assert CROPPED in read.warnings
    # The crop is the film: the model's square holds the film's own aspect, not the frame's.
    rows, cols = film.shape
    pixels = np.asarray(read.film.pixels)
    assert abs(pixels.shape[0] / pixels.shape[1] - rows / cols) < 0.03, (pixels.shape, film.shape)


def test_the_frame_finder_returns_the_films_box():
    film = _film(SEEDS[0])
    framed = np.pad(film, ((40, 30), (25, 50)), constant_values=255)
    assert find_film(framed).box == (40, 40 + film.shape[0], 25, 25 + film.shape[1])
    assert not find_film(film).cropped


@pytest.mark.parametrize("seed", SEEDS)
def test_a_burned_in_marker_is_blanked_for_the_model_and_said(seed):
    film = _film(seed)
    marked = np.asarray(VARIANT_KINDS["marker text"](film, np.random.default_rng(seed)))
    assert marker_box(film) is None and marker_box(marked) is not None
    read = REFUSE.read(png_bytes(marked))
    assert MARKER in read.warnings
    assert marker_box(np.asarray(read.film.pixels)) is None, "the marker is still in the model's copy"


@pytest.mark.parametrize("seed", SEEDS)
def test_an_inverted_film_is_flagged_never_read_silently(seed):
    data = variant_png("inverted", _film(seed), seed)
    with pytest.raises(NotAChestFilm) as refused:
        REFUSE.read(data)
    assert str(refused.value) == INVERTED and "Invert it" in INVERTED
    warned = FilmIntake(IntakeConfig(film_check="warn", cache_bytes=0)).read(data)
    assert INVERTED in warned.warnings


@pytest.mark.parametrize("kind", list(NEGATIVE_KINDS))
def test_non_films_stay_refused_at_every_stage(kind):
    for seed in range(6):
        with pytest.raises(NotAChestFilm) as refused:
            REFUSE.read(png_bytes(quantize(negative_film(kind, 70_000 + seed), 8)))
        assert "does not look like a frontal chest X-ray" in str(refused.value)
