"""The prior and the current film side by side, linked: one ViewState (window, level, invert, zoom, pan, the
tool's marks) applied to both, each half rendered by teaching/viewer.py from its own overview.

Layout: the prior on the left and the current film on the right, GAP_PX apart, and a label band below them (the
prior's interval under the left half, "Current" under the right: the page's own label covers the picture's top). The films' pixels are the viewer's own: nothing is
drawn over a film. Zoom and pan are fractions of each film (the view's focus), so the same anatomy stays in view
on both when the two films differ in size; the marks are kept in the current film's pixels and drawn on the prior
at the same fractions. A click on either half acts as the same click on the current film.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from medgemma_xray.teaching import viewer
from medgemma_xray.teaching.viewer import Crop, DisplayFilm, ViewState

GAP_PX = 8
BAND_PX = 44  # the label band's height (its text stays legible when the page scales the pair to half)
CURRENT_LABEL = "Current"


@dataclass(frozen=True)
class PairLayout:
    prior: Crop
    current: Crop
    current_left: int  # x of the current half's first column in the composed picture
    top: int  # y of the films' first row (0: the label band is below them)


def prior_label(interval: str) -> str:
    return f"Prior ({interval})" if interval else "Prior"


def _scaled_points(state: ViewState, source: DisplayFilm, target: DisplayFilm) -> tuple[tuple[float, float], ...]:
    """The marks (film pixels of `source`) at the same fractions of `target`."""
    (s_rows, s_cols), (t_rows, t_cols) = source.shape, target.shape
    return tuple(
        ((row + 0.5) * t_rows / s_rows - 0.5, (col + 0.5) * t_cols / s_cols - 0.5) for row, col in state.points
    )


def prior_state(prior: DisplayFilm, current: DisplayFilm, state: ViewState) -> ViewState:
    """The view of the prior linked to the current film's: the same state, the marks moved onto the prior."""
    return replace(state, points=_scaled_points(state, current, prior))


def layout(
    prior: DisplayFilm, current: DisplayFilm, state: ViewState, view_max: int = viewer.VIEW_MAX_PX
) -> PairLayout:
    prior_crop = viewer.view_crop(prior.shape, state, view_max)
    current_crop = viewer.view_crop(current.shape, state, view_max)
    return PairLayout(prior_crop, current_crop, prior_crop.out_cols + GAP_PX, 0)


def needs_full(prior: DisplayFilm, current: DisplayFilm, state: ViewState) -> tuple[bool, bool]:
    """Whether each half (prior, current) is zoomed past its overview's detail."""
    return viewer.needs_full(prior, prior_state(prior, current, state)), viewer.needs_full(current, state)


def _label(picture, x: int, y: int, text: str) -> None:
    from PIL import ImageDraw, ImageFont

    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default(size=30)
    draw.text((x + 8, y + 6), text, fill=230 if picture.mode == "L" else (230, 230, 230), font=font)


def render_pair(
    prior: DisplayFilm,
    current: DisplayFilm,
    state: ViewState,
    interval: str,
    full_prior: np.ndarray | None = None,
    full_current: np.ndarray | None = None,
    view_max: int = viewer.VIEW_MAX_PX,
    decorate_current: Callable[[np.ndarray, Crop], np.ndarray] | None = None,
) -> tuple[np.ndarray, PairLayout]:
    """The two films side by side under one view state, with their labels; uint8, grey (rows, cols) or RGB
    (rows, cols, 3) when the tool has marks. decorate_current: drawn on the current film's half (the pointing
    overlays: the student marks the current film), given its picture and crop."""
    from PIL import Image

    left, _ = viewer.render_view(prior, prior_state(prior, current, state), view_max, full=full_prior)
    right, right_crop = viewer.render_view(current, state, view_max, full=full_current)
    if decorate_current is not None:
        right = decorate_current(right, right_crop)
    placed = layout(prior, current, state, view_max)
    rgb = left.ndim == 3 or right.ndim == 3
    films = max(left.shape[0], right.shape[0])
    rows = films + BAND_PX
    cols = placed.current_left + right.shape[1]
    canvas = np.zeros((rows, cols, 3) if rgb else (rows, cols), dtype=np.uint8)

    def place(half: np.ndarray, x: int) -> None:
        if rgb and half.ndim == 2:
            half = np.repeat(half[:, :, None], 3, axis=2)
        canvas[: half.shape[0], x : x + half.shape[1]] = half

    place(left, 0)
    place(right, placed.current_left)
    picture = Image.fromarray(canvas)
    _label(picture, 0, films, prior_label(interval))
    _label(picture, placed.current_left, films, CURRENT_LABEL)
    return np.asarray(picture), placed


def current_film_point(
    prior: DisplayFilm,
    current: DisplayFilm,
    state: ViewState,
    view_x: float,
    view_y: float,
    view_max: int = viewer.VIEW_MAX_PX,
) -> tuple[float, float] | None:
    """The current film's (row, col) under a click on the composed picture (on the prior: the same fractions of
    the current film); None on the label band or the gap."""
    placed = layout(prior, current, state, view_max)
    y = view_y - placed.top
    if view_x < placed.prior.out_cols:
        if y >= placed.prior.out_rows:
            return None
        row, col = placed.prior.to_film(view_x, y)
        (p_rows, p_cols), (c_rows, c_cols) = prior.shape, current.shape
        return (row + 0.5) * c_rows / p_rows - 0.5, (col + 0.5) * c_cols / p_cols - 0.5
    x = view_x - placed.current_left
    if x < 0 or y >= placed.current.out_rows:
        return None
    return placed.current.to_film(x, y)


def click(
    prior: DisplayFilm,
    current: DisplayFilm,
    state: ViewState,
    view_x: float,
    view_y: float,
    view_max: int = viewer.VIEW_MAX_PX,
) -> ViewState:
    """A click on the composed picture: on either film it is the same click on the current film (pan, ruler,
    calliper, probe); on the band or the gap it changes nothing."""
    point = current_film_point(prior, current, state, view_x, view_y, view_max)
    if point is None:
        return state
    x_on_current, y_on_current = viewer.view_crop(current.shape, state, view_max).to_view(*point)
    return viewer.click(current, state, x_on_current, y_on_current, view_max)
