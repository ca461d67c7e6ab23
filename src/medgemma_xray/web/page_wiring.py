"""Gradio pages as modules: module-level handlers, each declared with the events that run it, right above it.

    EVENTS = PageEvents()

    @EVENTS.on(["ask.click", "question.submit"], inputs=["question", "session"], outputs=["chat", "session"],
               api_name="ask")
    def answer(page, values):                 # values: {"question": ..., "session": ...}
        yield {"chat": [...]}                 # a dict keyed by component name: only those change

As gr.on does (Gradio's demo/multipage), the declaration sits next to the handler; it is applied when the page's
layout exists (EVENTS.wire(components, page)), since no component may be made at import time. Handlers are plain
functions of (page, values[, request][, event]) returning or yielding dicts keyed by component name, so each
reads like the calculator_list_and_dict demo without one positional parameter per form field. Inputs stay in the
declared order, so an API client's parameters keep a stable order. A trigger "name.then" or "name.success" chains
after the handler called name (a step with no handler runs only its js in the browser).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Wiring:
    name: str
    handler: Callable | None
    triggers: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    request: bool  # the handler takes the gr.Request (its client, its login) after the values
    event: bool  # the handler takes the event's data (gr.SelectData) last
    options: dict[str, Any] = field(default_factory=dict)


class PageEvents:
    def __init__(self) -> None:
        self.wirings: list[Wiring] = []

    def on(
        self,
        triggers: list[str],
        inputs: list[str] | tuple[str, ...] = (),
        outputs: list[str] | tuple[str, ...] = (),
        *,
        request: bool = False,
        event: bool = False,
        **options: Any,
    ) -> Callable[[Callable], Callable]:
        """Declare the events that run the decorated handler (gr.on's options: api_name, queue, js, ...)."""

        def register(handler: Callable) -> Callable:
            self._add(Wiring(handler.__name__, handler, tuple(triggers), tuple(inputs), tuple(outputs), request,
                             event, dict(options)))  # fmt: skip
            return handler

        return register

    def js(self, name: str, triggers: list[str], js: str, outputs: list[str] | tuple[str, ...] = (), **options: Any):
        """A step that runs only in the browser (scrolling, a layout switch), chainable as `name.then`."""
        self._add(Wiring(name, None, tuple(triggers), (), tuple(outputs), False, False, {"js": js, **options}))

    def _add(self, wiring: Wiring) -> None:
        if any(existing.name == wiring.name for existing in self.wirings):
            raise ValueError(f"two page events are called {wiring.name!r}")
        self.wirings.append(wiring)

    def wire(
        self, components: Mapping[str, Any], page: object, concurrency: Mapping[str, int] | None = None
    ) -> dict[str, Any]:
        """Apply every declaration to the layout's components (inside its Blocks); returns each step's dependency.
        concurrency: the limit of each concurrency_id the declarations name (settings are known only here)."""
        import gradio as gr

        limits = dict(concurrency or {})

        steps: dict[str, Any] = {}
        for wiring in self.wirings:
            listeners = []
            chained: tuple[Any, str] | None = None
            for trigger in wiring.triggers:
                source, _, kind = trigger.rpartition(".")
                if source in steps:
                    chained = (steps[source], kind)
                else:
                    listeners.append(getattr(components[source], kind))
            fn = _bound(wiring, components, page) if wiring.handler is not None else None
            options = {"api_name": False} | wiring.options
            if options.get("concurrency_id") in limits:
                options["concurrency_limit"] = limits[options["concurrency_id"]]
            arguments = dict(
                fn=fn,
                inputs=[components[name] for name in wiring.inputs],
                outputs=[components[name] for name in wiring.outputs],
                **options,
            )
            if chained is not None:
                if listeners:
                    raise ValueError(f"{wiring.name}: a step chains after another step or listens to events, not both")
                dependency, kind = chained
                steps[wiring.name] = getattr(dependency, kind)(**arguments)
            else:
                steps[wiring.name] = gr.on(listeners, **arguments)
        return steps


def _bound(wiring: Wiring, components: Mapping[str, Any], page: object) -> Callable:
    """The function Gradio calls: the inputs by position (plus the request or event data, which Gradio finds by
    their annotations), handed to the handler as a dict; its dict (or each yielded dict) keyed by component."""
    import gradio as gr

    handler = wiring.handler
    if handler is None:
        raise ValueError(f"{wiring.name} has no handler to bind")
    count = len(wiring.inputs)
    outputs = {name: components[name] for name in wiring.outputs}

    def arguments(args: tuple) -> list[Any]:
        values = dict(zip(wiring.inputs, args[:count], strict=True))
        extra = list(args[count:])
        return [page, values, *extra]

    def translate(update: Mapping[str, Any] | None) -> dict[Any, Any] | None:
        if not outputs:
            return None
        if not update:  # nothing changes: each output skipped (Gradio reads an empty dict as one missing value)
            return {component: gr.skip() for component in outputs.values()}
        unknown = set(update) - set(outputs)
        if unknown:
            raise KeyError(f"{wiring.name} returned {sorted(unknown)}, which are not among its outputs")
        return {outputs[name]: value for name, value in update.items()}

    def streamed(*args: Any) -> Iterator[dict[Any, Any] | None]:
        for update in handler(*arguments(args)):
            yield translate(update)

    def returned(*args: Any) -> dict[Any, Any] | None:
        return translate(handler(*arguments(args)))

    bound: Callable = streamed if inspect.isgeneratorfunction(handler) else returned

    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in _names(wiring)]
    annotations: dict[str, Any] = {}
    if wiring.request:
        parameters.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD))
        annotations["request"] = gr.Request
    if wiring.event:
        parameters.append(inspect.Parameter("event", inspect.Parameter.POSITIONAL_OR_KEYWORD))
        annotations["event"] = gr.SelectData
    bound.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    bound.__annotations__ = annotations
    bound.__name__ = wiring.name
    bound.__doc__ = handler.__doc__
    return bound


def _names(wiring: Wiring) -> list[str]:
    """Python names for the inputs (component names may repeat a keyword or start with a digit)."""
    return [f"in_{index}_{name}" if not name.isidentifier() else name for index, name in enumerate(wiring.inputs)]
