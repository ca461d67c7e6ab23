"""/teaching's viewer for a case with a prior: both films side by side under the one view state
(teaching/paired_view.py), rendered on the server as the single film is, with the same outputs (web.teaching_view
calls this for such a case). Each half reads its full-resolution values from the intake's cache only where it is
zoomed past its overview.
"""

from __future__ import annotations

from typing import Any

from medgemma_xray.teaching.rounds import Round
from medgemma_xray.web.teaching_context import TeachingPage


def _full(page: TeachingPage, key: str, wanted: bool):
    if not wanted or not key:
        return None
    values = page.intake.values(key)
    return values.values if values is not None else None


def paired_outputs(page: TeachingPage, round_: Round, layers: Any = ()) -> dict[str, Any]:
    """The view's outputs for a case with a prior; layers (teaching.pointing.layers_of) are drawn on the current
    film's half."""
    from medgemma_xray.teaching import paired_view, viewer

    prior = round_.prior
    if prior is None:
        raise ValueError("paired_outputs needs a round with a prior film")
    current, view = round_.display, round_.view
    prior_zoomed, current_zoomed = paired_view.needs_full(prior.display, current, view)
    full_prior = _full(page, prior.display.key, prior_zoomed)
    full_current = _full(page, current.key, current_zoomed or view.tool == "probe")
    key = ("pair", prior.display.key, prior.interval, current.key, view.centre, view.width, view.invert, view.zoom,
           view.focus, view.tool, view.points, layers)  # fmt: skip

    def decorate(picture, crop):
        from medgemma_xray.teaching.overlays import draw_layers

        return draw_layers(picture, crop, current.shape, layers)

    def render():
        return paired_view.render_pair(
            prior.display, current, view, prior.interval, full_prior, full_current,
            decorate_current=decorate if layers else None,
        )[0]  # fmt: skip

    picture = (
        page.view_files.cached(key, render) if current.key and prior.display.key else page.view_files.write(render())
    )
    measure = viewer.measurement_text(current, view, full_current)
    measure += (
        f"\n\n_Side by side: the prior ({prior.interval or 'date not given'}) on the left, this film on the right, "
        "with one window, zoom and pan._"
    )
    if (prior_zoomed and full_prior is None) or (current_zoomed and full_current is None):
        measure += "\n\n_Zoomed past the kept copy's detail: open the case again to see the films at full resolution._"
    return {"view": picture, "centre": round(view.centre, 2), "width": round(view.width, 2), "measure": measure}
