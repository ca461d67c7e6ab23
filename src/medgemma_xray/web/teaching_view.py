"""/teaching's viewer events: window presets, invert, zoom, reset, level and width, the tool, and clicks on the film.

Each returns the new picture (rendered on the server by medgemma_xray.teaching.viewer from the session's overview,
or from the intake's full-resolution values where the view is zoomed past the overview's detail).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from medgemma_xray.teaching.rounds import Round
from medgemma_xray.web.page_wiring import PageEvents
from medgemma_xray.web.teaching_context import TeachingPage, current_round

EVENTS = PageEvents()


VIEW_OUT = ["view", "centre", "width", "measure"]
# A tool whose clicks another module handles: tool -> handler(page, values, event) (web.teaching_marks: "mark").
TOOL_CLICKS: dict[str, Callable[..., dict]] = {}


def view_outputs(page: TeachingPage, round_: Round) -> dict[str, Any]:
    from medgemma_xray.teaching import viewer
    from medgemma_xray.teaching.pointing import layers_of

    layers = layers_of(round_.pointing)  # the key's regions, the student's marks, the model's boxes
    if round_.prior is not None:  # the prior beside the film, linked (web.teaching_pair_view)
        from medgemma_xray.web.teaching_pair_view import paired_outputs

        return paired_outputs(page, round_, layers)
    display, view = round_.display, round_.view
    full = None
    zoomed = viewer.needs_full(display, view)
    if zoomed or view.tool == "probe":
        values = page.intake.values(display.key)
        full = values.values if values is not None else None
    key = (display.key, view.centre, view.width, view.invert, view.zoom, view.focus, view.tool, view.points, layers)

    def render():  # only on a miss
        from medgemma_xray.teaching.overlays import draw_layers

        picture, crop = viewer.render_view(display, view, full=full)
        return draw_layers(picture, crop, display.shape, layers) if layers else picture

    picture = page.view_files.cached(key, render) if display.key else page.view_files.write(render())
    measure = viewer.measurement_text(display, view, full)
    if full is None and zoomed:
        measure += "\n\n_Zoomed past the kept copy's detail: open the case again to see the film at full resolution._"
    return {"view": picture, "centre": round(view.centre, 2), "width": round(view.width, 2), "measure": measure}


def _view_changed(page: TeachingPage, values: dict, change) -> dict:
    """Its outputs are the level and width sliders too (inputs): with no case open it says so in a notice and
    changes nothing, rather than an error that would mark them."""
    import gradio as gr

    from medgemma_xray.web.teaching_context import NO_CASE, session_of

    if session_of(values).value.current is None:
        gr.Warning(NO_CASE)
        return {}
    session, held, round_ = current_round(values)
    changed = replace(round_, view=change(round_))
    session.update(lambda s: s.updated(changed) if s.current is round_ else s)
    return {**view_outputs(page, changed), "session": session}


def _register_preset(name: str) -> None:
    def handler(page: TeachingPage, values: dict) -> dict:
        return _view_changed(page, values, lambda r: r.view.with_window(*r.display.preset(name)))

    handler.__name__ = f"window_{name}"
    handler.__doc__ = f"The {name} window preset."
    EVENTS.on([f"{name}_button.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"],
              api_name=f"teaching_window_{name}")(handler)  # fmt: skip


for _preset in ("lung", "mediastinum", "bone", "file"):
    _register_preset(_preset)


@EVENTS.on(["invert_button.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_invert")
def invert(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: replace(r.view, invert=not r.view.invert))


@EVENTS.on(["zoom_in.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_zoom_in")
def zoom_in(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.zoomed(r.view.zoom * 2.0))


@EVENTS.on(["zoom_out.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_zoom_out")
def zoom_out(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.zoomed(r.view.zoom * 0.5))


@EVENTS.on(["reset_button.click"], inputs=["session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_reset")
def reset(page: TeachingPage, values: dict) -> dict:
    from medgemma_xray.teaching import viewer

    return _view_changed(page, values, lambda r: replace(viewer.ViewState.initial(r.display), tool=r.view.tool))


def _finite(value: object) -> float | None:
    """A typed number, or None for anything else an API client may send in its place (text, inf, NaN)."""
    import math

    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@EVENTS.on(["centre.submit", "width.submit", "apply_window.click"], inputs=["centre", "width", "session"],
           outputs=[*VIEW_OUT, "session"], api_name="teaching_window")  # fmt: skip
def set_window(page: TeachingPage, values: dict) -> dict:
    """A typed level or width (Enter applies it), or the window a right- or middle-button drag on the film set."""
    import gradio as gr

    from medgemma_xray.web.teaching_context import session_of

    held = session_of(values).value.current
    centre, width = _finite(values["centre"]), _finite(values["width"])
    if held is not None and (centre is None or width is None or not width > 0):
        gr.Warning("Type a level and a width above 0, then press Enter.")
        return {"centre": held.view.centre, "width": held.view.width}
    return _view_changed(page, values, lambda r: r.view.with_window(centre, width))


@EVENTS.on(["tool.change"], inputs=["tool", "session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_tool")
def set_tool(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.with_tool(values["tool"]))


# One listener for every tool's click (a second one on the same event made the browser drop quick clicks).
@EVENTS.on(["view.select"], inputs=["mark_finding", "mark_shape", "session"],
           outputs=[*VIEW_OUT, "session", "mark_list", "overlay_legend"], event=True)  # fmt: skip
def clicked(page: TeachingPage, values: dict, event) -> dict:
    from medgemma_xray.teaching import paired_view, viewer
    from medgemma_xray.web.teaching_context import session_of

    held = session_of(values).value.current
    tool_click = TOOL_CLICKS.get(held.view.tool) if held is not None else None
    if tool_click is not None:
        return tool_click(page, values, event)
    x, y = event.index

    def clicked_on(r: Round):
        if r.prior is not None:  # either half of the pair: the same click on the current film
            return paired_view.click(r.prior.display, r.display, r.view, float(x), float(y))
        return viewer.click(r.display, r.view, float(x), float(y))

    return _view_changed(page, values, clicked_on)
