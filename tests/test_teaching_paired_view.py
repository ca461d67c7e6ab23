"""teaching/paired_view.py: the prior and the current film side by side under one view state. Each half is exactly
the single-film viewer's picture of that film under the same state; a window change changes both halves; a click
on either half is the same click on the current film; a session keeps only the two overviews."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from medgemma_xray.phantoms.labelled import labelled_phantom
from medgemma_xray.teaching import paired_view, viewer
from medgemma_xray.teaching.viewer import OVERVIEW_MAX_PX, ViewState, display_film
from medgemma_xray.xray_io.values import FilmValues


def _film(seed: int, rows: int, cols: int | None = None):
    values = (labelled_phantom(seed, rows, cols).film * 4095).astype(np.float32)
    return display_film(FilmValues(values, (2048.0, 4096.0), (0.4, 0.4), 12), "test")


PRIOR, CURRENT = _film(3, 512), _film(4, 512, 448)  # two sizes: the halves differ in width


def _halves(picture: np.ndarray, placed: paired_view.PairLayout) -> tuple[np.ndarray, np.ndarray]:
    top = placed.top
    left = picture[top : top + placed.prior.out_rows, : placed.prior.out_cols]
    right = picture[
        top : top + placed.current.out_rows, placed.current_left : placed.current_left + placed.current.out_cols
    ]
    return left, right


def test_each_half_is_the_single_viewer_picture_under_the_same_state():
    state = replace(ViewState.initial(CURRENT), zoom=2.0, focus=(0.4, 0.6), invert=True).with_window(1500, 2000)
    picture, placed = paired_view.render_pair(PRIOR, CURRENT, state, "3 months earlier")
    left, right = _halves(picture, placed)
    assert np.array_equal(left, viewer.render_view(PRIOR, state)[0])
    assert np.array_equal(right, viewer.render_view(CURRENT, state)[0])
    assert placed.current_left == placed.prior.out_cols + paired_view.GAP_PX
    band = picture[-paired_view.BAND_PX :]
    assert band[:, : placed.prior.out_cols].max() > 200 and band[:, placed.current_left :].max() > 200  # labels


def test_a_window_change_changes_both_halves():
    state = ViewState.initial(CURRENT)
    before, placed = paired_view.render_pair(PRIOR, CURRENT, state, "1 year earlier")
    after, _ = paired_view.render_pair(
        PRIOR, CURRENT, state.with_window(state.centre + 600, state.width), "1 year earlier"
    )
    for old, new in zip(_halves(before, placed), _halves(after, placed), strict=True):
        assert np.abs(old.astype(int) - new.astype(int)).mean() > 20  # a higher level: both films darker


def test_a_click_on_either_half_is_the_same_click_on_the_current_film():
    state = ViewState.initial(CURRENT).with_tool("pan")
    placed = paired_view.layout(PRIOR, CURRENT, state)
    # the same film fraction (a quarter down, a third across) on each half
    on_prior = (placed.prior.out_cols / 3, placed.top + placed.prior.out_rows / 4)
    on_current = (placed.current_left + placed.current.out_cols / 3, placed.top + placed.current.out_rows / 4)
    panned_prior = paired_view.click(PRIOR, CURRENT, state, *on_prior)
    panned_current = paired_view.click(PRIOR, CURRENT, state, *on_current)
    assert np.allclose(panned_prior.focus, (0.25, 1 / 3), atol=0.01)
    assert np.allclose(panned_prior.focus, panned_current.focus, atol=0.01)
    below = placed.prior.out_rows + 3
    assert paired_view.click(PRIOR, CURRENT, state, 5, below) == state  # the label band: nothing
    ruler = paired_view.click(PRIOR, CURRENT, ViewState.initial(CURRENT), *on_prior)
    row, col = ruler.points[0]
    assert abs(row - 0.25 * CURRENT.shape[0]) < 2 and abs(col - CURRENT.shape[1] / 3) < 2  # in the current's pixels


def test_marks_are_drawn_on_both_halves_at_the_same_fractions():
    state = replace(ViewState.initial(CURRENT), points=((128.0, 112.0), (384.0, 336.0)))
    moved = paired_view.prior_state(PRIOR, CURRENT, state)
    scale = PRIOR.shape[1] / CURRENT.shape[1]  # both 512 rows; the prior is wider
    assert np.allclose(moved.points, ((128.0, 112.5 * scale - 0.5), (384.0, 336.5 * scale - 0.5)))
    picture, _ = paired_view.render_pair(PRIOR, CURRENT, state, "")
    assert picture.ndim == 3  # coloured marks


def test_a_big_pair_costs_a_session_its_two_overviews_only():
    big = display_film(FilmValues(np.zeros((4000, 3000), np.float32), (0.5, 1.0), None, 8), "big")
    from medgemma_xray.teaching.prior_round import PriorView

    prior = PriorView(big, None, None, "")
    assert max(big.overview.shape) == OVERVIEW_MAX_PX and prior.nbytes == big.nbytes < 5 << 20


def test_overlays_go_on_the_current_half_and_a_mark_lands_on_the_current_film_from_either_half():
    state = ViewState.initial(CURRENT)
    placed = paired_view.layout(PRIOR, CURRENT, state)

    def red(picture, crop):
        assert crop == placed.current
        return np.stack([np.full_like(picture, 255), picture, picture], axis=2)

    picture, _ = paired_view.render_pair(PRIOR, CURRENT, state, "", decorate_current=red)
    left, right = _halves(picture, placed)
    assert (right[..., 0] == 255).all() and not (left[..., 0] == 255).all()
    on_prior = paired_view.current_film_point(
        PRIOR, CURRENT, state, placed.prior.out_cols / 2, placed.prior.out_rows / 2
    )
    on_current = paired_view.current_film_point(
        PRIOR, CURRENT, state, placed.current_left + placed.current.out_cols / 2, placed.current.out_rows / 2
    )
    assert np.allclose(on_prior, on_current, atol=1.0)
    assert paired_view.current_film_point(PRIOR, CURRENT, state, placed.prior.out_cols + 2, 10) is None  # the gap
