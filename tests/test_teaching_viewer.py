"""medgemma_xray.teaching.viewer: the film's own values and window (from the intake's one decode), presets, invert,
zoom and pan (the full-resolution values used only where the overview lacks the detail), and the ruler and
calliper in millimetres from the DICOM pixel spacing ("uncalibrated" without it)."""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.intake import FilmIntake, IntakeConfig
from medgemma_xray.phantoms.films import dicom_bytes, png_bytes, quantize
from medgemma_xray.phantoms.labelled import labelled_phantom
from medgemma_xray.teaching.viewer import (
    PRESET_PERCENTILES,
    ViewState,
    click,
    display_film,
    measurement_text,
    needs_full,
    render_view,
    view_crop,
    windowed,
)

INTAKE = FilmIntake(IntakeConfig(film_check="off"))
FILM = labelled_phantom(1).film


def read_display_film(data: bytes, overview_max: int = 1080):
    """What the teaching page does with an upload: the intake's one decode, the viewer's overview of its values."""
    film, values = INTAKE.read_with_values(data)
    return values, display_film(values, film.source, film.key, overview_max)


def _dicom_bytes(**kwargs) -> bytes:
    options = {"bits_stored": 12, "window": (1800, 3000), "pixel_spacing_mm": 0.5, **kwargs}
    stored = quantize(FILM, 12)
    if options.get("photometric") == "MONOCHROME1":
        stored = (4095 - stored).astype(np.uint16)
    return dicom_bytes(stored, **options)


def _dicom(**kwargs):
    return read_display_film(_dicom_bytes(**kwargs))[1]


def test_dicom_values_and_window_come_from_the_file():
    values, film = read_display_film(_dicom_bytes(rescale=(2.0, -1000.0)))
    assert film.default_window == (1800.0, 3000.0) and film.pixel_spacing_mm == (0.5, 0.5)
    expected = quantize(FILM, 12).astype(np.float32) * 2 - 1000  # the Modality LUT applied, nothing stretched
    assert np.array_equal(values.values, expected)
    assert film.value_range == (float(expected.min()), float(expected.max()))


def test_monochrome1_is_shown_bright_where_attenuating():
    # The same film stored inverted, with its window in its own (inverted) stored values, as a MONOCHROME1 file is.
    plain, inverted = _dicom(), _dicom(photometric="MONOCHROME1", window=(4095 - 1800, 3000))
    state_plain, state_inverted = ViewState.initial(plain), ViewState.initial(inverted)
    picture_plain, _ = render_view(plain, state_plain)
    picture_inverted, _ = render_view(inverted, state_inverted)
    assert np.abs(picture_plain.astype(int) - picture_inverted.astype(int)).max() <= 1


def test_png_keeps_its_8_or_16_bits():
    eight = read_display_film(png_bytes(quantize(FILM, 8)))[1]
    values, sixteen = read_display_film(png_bytes(quantize(FILM, 16)))
    assert (eight.bits, eight.default_window, eight.pixel_spacing_mm) == (8, (128.0, 256.0), None)
    assert sixteen.bits == 16 and np.array_equal(values.values, quantize(FILM, 16).astype(np.float32))


def test_a_session_keeps_an_overview_and_a_zoomed_view_reads_the_full_values():
    """The viewer's film in a session is at most the overview's size; a whole-film view needs nothing more, a view
    zoomed past the overview's detail is sharp only with the full-resolution values (and still correct without)."""
    values, film = read_display_film(_dicom_bytes(), overview_max=300)  # 1.5 views, as the page keeps
    assert max(film.overview.shape) == 300 and film.shape == values.shape and film.nbytes < values.nbytes / 2
    whole = ViewState.initial(film)
    assert not needs_full(film, whole, view_max=200)
    zoomed = whole.zoomed(8)
    assert needs_full(film, zoomed, view_max=200)
    sharp, _ = render_view(film, zoomed, view_max=200, full=values.values)
    soft, _ = render_view(film, zoomed, view_max=200)
    reference, _ = render_view(read_display_film(_dicom_bytes(), overview_max=10_000)[1], zoomed, view_max=200)
    assert sharp.shape == soft.shape == reference.shape
    assert np.abs(sharp.astype(int) - reference.astype(int)).max() <= 1  # the full film's own pixels
    assert np.abs(soft.astype(int) - reference.astype(int)).mean() > 1  # the overview's: blurred


def test_presets_are_percentile_windows_of_the_film_and_change_the_pixels():
    film = _dicom()
    state = ViewState.initial(film)
    pictures = {"file": render_view(film, state)[0].astype(int)}
    assert film.preset("file") == (1800, 3000)  # the file's own window (its VOI)
    for name, (low_q, high_q) in PRESET_PERCENTILES.items():
        centre, width = film.preset(name)
        low, high = np.percentile(film.overview, [low_q, high_q])
        assert (centre, width) == pytest.approx(((low + high) / 2, high - low))
        pictures[name] = render_view(film, state.with_window(centre, width))[0].astype(int)
        assert np.abs(pictures[name] - pictures["file"]).mean() > 5, name
    with pytest.raises(ValueError, match="unknown preset 'soft'; choose from file, lung, mediastinum, bone"):
        film.preset("soft")


def test_the_bone_preset_is_readable_on_every_starter_phantom(tmp_path):
    """A fixed fraction of the file's window rendered Bone almost black (mean grey 6 of 255); the film's own
    percentiles keep it readable on every phantom of the starter set, DICOM and PNG alike."""
    from medgemma_xray.teaching.library import write_starter_set

    for path in write_starter_set(tmp_path, 8):
        film = read_display_film(path.read_bytes())[1]
        grey = render_view(film, ViewState.initial(film).with_window(*film.preset("bone")))[0]
        assert 60 <= grey.mean() <= 200, (path.suffix, grey.mean())


def test_the_probe_reads_the_stored_value_and_the_grey_it_is_shown_as():
    stored = quantize(FILM, 12)
    stored[100:105, 200:205] = 1234
    values, film = read_display_film(dicom_bytes(stored, bits_stored=12, window=(1800, 3000)), overview_max=256)
    state = ViewState.initial(film).with_tool("probe")
    crop = view_crop(film.shape, state)
    x, y = crop.to_view(102, 202)
    probed = click(film, state, x, y)
    text = measurement_text(film, probed, values.values)
    assert "stored value 1234," in text and f"displayed grey {windowed(np.float32([1234]), 1800, 3000)[0]} " in text
    assert "(from the kept overview)" in measurement_text(film, probed)  # without the full values it says so


def test_window_level_and_invert_map_values_linearly():
    values = np.array([[0, 100, 150, 200, 300]], dtype=np.float32)
    assert windowed(values, 150, 100).tolist() == [[0, 0, 127, 255, 255]]
    assert windowed(values, 150, 100, invert=True).tolist() == [[255, 255, 128, 0, 0]]


def test_zoom_and_pan_show_the_film_point_clicked():
    film = _dicom()
    state = ViewState.initial(film).zoomed(4).with_tool("pan")
    rows, cols = film.shape
    crop = view_crop(film.shape, state)
    assert crop.height == pytest.approx(rows / 4) and crop.width == pytest.approx(cols / 4)
    target = crop.to_view(rows * 0.4, cols * 0.45)  # a point inside the zoomed view
    panned = click(film, state, *target)
    assert panned.focus == pytest.approx((0.4, 0.45), abs=1e-3)
    assert ViewState.initial(film).zoomed(100).zoom == 8.0 and ViewState.initial(film).zoomed(0.1).zoom == 1.0


def test_the_ruler_reads_millimetres_from_the_pixel_spacing():
    film = _dicom(pixel_spacing_mm=0.78125)
    state = ViewState.initial(film)
    crop = view_crop(film.shape, state)
    for row in (100, 400):
        state = click(film, state, *crop.to_view(row, 200))
    assert measurement_text(film, state) == "Ruler: 234.4 mm (300.0 px at 0.7812 mm/px)."
    zoomed = ViewState.initial(film).zoomed(2)
    crop = view_crop(film.shape, zoomed)
    for row in (200, 300):
        zoomed = click(film, zoomed, *crop.to_view(row, 200))
    assert measurement_text(film, zoomed).startswith("Ruler: 78.1 mm")


def test_without_pixel_spacing_the_ruler_says_uncalibrated():
    film = read_display_film(png_bytes(quantize(FILM, 8)))[1]
    state = ViewState.initial(film)
    crop = view_crop(film.shape, state)
    for row in (100, 200):
        state = click(film, state, *crop.to_view(row, 100))
    assert measurement_text(film, state) == "Ruler: 100.0 px (uncalibrated: the film records no pixel spacing)."


def test_the_ctr_calliper_divides_the_heart_by_the_thorax():
    film = _dicom(pixel_spacing_mm=0.5)
    state = ViewState.initial(film).with_tool("ctr")
    crop = view_crop(film.shape, state)
    assert "click the heart: right border (1 of 4)" in measurement_text(film, state)
    for col in (150, 270, 50, 350):
        state = click(film, state, *crop.to_view(300, col))
    assert measurement_text(film, state) == "CTR calliper: cardiothoracic ratio 0.40 (heart 6.0 cm, thorax 15.0 cm)."
    state = click(film, state, *crop.to_view(300, 10))  # a fifth click starts over
    assert len(state.points) == 1


def test_a_4300_by_3500_film_renders_every_view():
    """The overview's sides round apart (1080 x 879 for 4300 x 3500): a whole-film view must not ask Pillow for a
    box past the overview's edge (it raised "box can't exceed original image size")."""
    from medgemma_xray.xray_io.values import FilmValues

    values = np.tile(np.linspace(0, 4095, 3500, dtype=np.float32), (4300, 1))
    film = display_film(FilmValues(values, (2048, 4096), None, 12), "synthetic", "key")
    assert film.overview.shape == (1080, 879)
    state = ViewState.initial(film)
    for view in (state, state.zoomed(2), state.zoomed(8), click(film, state, 300, 300)):
        picture = render_view(film, view, full=values)[0]
        assert picture.shape[:2] == (720, 586) and picture.std() > 1
