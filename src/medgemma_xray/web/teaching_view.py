"""/teaching's viewer events: window presets, invert, zoom, reset, level and width, the tool, and clicks on the film.

Each returns the new picture (rendered on the server by medgemma_xray.teaching.viewer from the session's overview,
or from the intake's full-resolution values where the view is zoomed past the overview's detail).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from medgemma_xray.teaching.rounds import Round
from medgemma_xray.web.page_wiring import PageEvents
from medgemma_xray.web.teaching_context import TeachingPage, current_round

EVENTS = PageEvents()


VIEW_OUT = ["view", "centre", "width", "measure"]


def view_outputs(page: TeachingPage, round_: Round) -> dict[str, Any]:
    import gradio as gr

    from medgemma_xray.teaching import viewer

    display = round_.display
    full = None
    if viewer.needs_full(display, round_.view):
        values = page.intake.values(display.key)
        full = values.values if values is not None else None
    picture = page.view_files.write(viewer.render_view(display, round_.view, full=full)[0])
    low, high = display.window_limits
    span = max(high - low, 1.0)
    measure = viewer.measurement_text(display, round_.view)
    if full is None and viewer.needs_full(display, round_.view):
        measure += "\n\n_Zoomed past the kept copy's detail: open the case again to see the film at full resolution._"
    return {
        "view": picture,
        "centre": gr.update(value=round_.view.centre, minimum=low, maximum=high),
        "width": gr.update(value=round_.view.width, minimum=1.0, maximum=2 * span),
        "measure": measure,
    }


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


@EVENTS.on(["centre.release", "width.release"], inputs=["centre", "width", "session"], outputs=[*VIEW_OUT, "session"],
           api_name="teaching_window")  # fmt: skip
def set_window(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.with_window(values["centre"], values["width"]))


@EVENTS.on(["tool.change"], inputs=["tool", "session"], outputs=[*VIEW_OUT, "session"], api_name="teaching_tool")
def set_tool(page: TeachingPage, values: dict) -> dict:
    return _view_changed(page, values, lambda r: r.view.with_tool(values["tool"]))


@EVENTS.on(["view.select"], inputs=["session"], outputs=[*VIEW_OUT, "session"], event=True)
def clicked(page: TeachingPage, values: dict, event) -> dict:
    from medgemma_xray.teaching import viewer

    x, y = event.index
    return _view_changed(page, values, lambda r: viewer.click(r.display, r.view, float(x), float(y)))
