"""The API's parts, built once per server and kept on the FastAPI app, as vLLM keeps its serving classes on
app.state: the routes find them there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from medgemma_xray.web.login_guard import LoginGuard
from medgemma_xray.web.openai.login import BearerCheck

if TYPE_CHECKING:
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.openai.http_edge import BodyReader
    from medgemma_xray.web.openai.serving_chat import OpenAIServingChat
    from medgemma_xray.web.openai.serving_models import OpenAIServingModels


@dataclass
class OpenAIState:
    models: OpenAIServingModels
    chat: OpenAIServingChat
    bearer: BearerCheck
    body: BodyReader

    @staticmethod
    def of(request) -> OpenAIState:
        return request.app.state.openai

    async def login(self, request) -> str | None:
        address = request.client.host if request.client else None
        return await self.bearer.user(request.headers.get("authorization"), address)


def build_state(service: InferenceSurface, auth: LoginGuard | Callable[[str, str], bool] | None) -> OpenAIState:
    """auth: the server's LoginGuard (or a plain check, which gets its own)."""
    from medgemma_xray.intake import FilmIntake
    from medgemma_xray.web.asking import Asking
    from medgemma_xray.web.openai.conversation_ids import ConversationIds
    from medgemma_xray.web.openai.films import FilmReader
    from medgemma_xray.web.openai.http_edge import BodyReader
    from medgemma_xray.web.openai.serving_chat import OpenAIServingChat
    from medgemma_xray.web.openai.serving_models import OpenAIServingModels

    settings = service.settings
    models = OpenAIServingModels(service)
    films = FilmReader(FilmIntake.for_settings(settings))  # the pages' intake: one film cache for every door
    chat = OpenAIServingChat(service, models, films, ConversationIds(), Asking.for_service(service))
    guard = auth if auth is None or isinstance(auth, LoginGuard) else LoginGuard(auth)
    return OpenAIState(models, chat, BearerCheck(guard), BodyReader(settings))
