"""web.page_wiring on a real Gradio app: a handler that returns nothing to change ({}) leaves its outputs as they
are. Gradio reads an empty dict as one missing value and fails the event ("didn't return enough output values"),
which blanked /teaching's view when the Mark tool's click handler ignored another tool's click."""

from __future__ import annotations

import pytest
from gradio_client import Client

from medgemma_xray.web.page_wiring import PageEvents

EVENTS = PageEvents()


@EVENTS.on(["go.click"], inputs=["text"], outputs=["text", "other"], api_name="nothing")
def nothing(page, values: dict) -> dict:
    return {}


@EVENTS.on(["set.click"], inputs=["text"], outputs=["text", "other"], api_name="something")
def something(page, values: dict) -> dict:
    return {"other": values["text"].upper()}


@pytest.fixture(scope="module")
def app_url():
    import gradio as gr

    with gr.Blocks() as demo:
        ui = {"text": gr.Textbox("kept"), "other": gr.Textbox("also kept")}
        ui["go"], ui["set"] = gr.Button("go"), gr.Button("set")
        EVENTS.wire(ui, page=None)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    yield url
    demo.close()


def test_a_handler_that_changes_nothing_leaves_its_outputs_as_they_are(app_url):
    client = Client(app_url, verbose=False)
    unchanged = {"__type__": "update"}  # what the API shows for an output left as it is
    assert client.predict("typed", api_name="/nothing") == (unchanged, unchanged)  # before: AppError
    assert client.predict("typed", api_name="/something") == (unchanged, "TYPED")
