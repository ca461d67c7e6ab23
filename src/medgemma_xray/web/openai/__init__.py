"""The OpenAI-compatible API, in vLLM's three parts: the routes (api_router), the typed request and answers
(protocol), and the serving classes (serving_chat, serving_models). The server calls add_openai_routes once.

    POST /v1/chat/completions   (stream or not; the film as an image_url data: URL: PNG, JPEG or application/dicom)
    GET  /v1/models, GET /v1/models/{id}, GET /v1/openapi.json

What differs from OpenAI, on purpose: the server fetches nothing (send the film inline); one film per conversation,
in the first user message (two where the checkpoint compares films: the prior, then the current film); decoding is greedy; the request may carry conversation_id and the answer carries a
`medgemma` object (protocol.py). With a login file (AUTH_FILE), the API key is "name:password" of a login user.
Logs get the request's shape (stream, sizes, error class), never a file's name, its tags or the question's text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.login_guard import LoginGuard


def add_openai_routes(
    api, service: InferenceSurface, auth: LoginGuard | Callable[[str, str], bool] | None = None
) -> None:
    """The API's routes on the FastAPI app (before Gradio mounts at /), with OpenAI's 404 or 405 for any other /v1
    route, and its parts on api.state."""
    from medgemma_xray.web.openai.api_router import router
    from medgemma_xray.web.openai.app_state import build_state

    api.state.openai = build_state(service, auth)
    api.include_router(router)
