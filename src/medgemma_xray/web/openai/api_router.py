"""The API's routes: each one is the login, the typed request, and a call to its serving class."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from medgemma_xray.web.openai.app_state import OpenAIState
from medgemma_xray.web.openai.http_edge import (
    CHAT_REQUEST_BODY,
    ERROR_RESPONSES,
    OpenAIRoute,
    not_a_route,
    openapi_document,
    register_any_path,
)
from medgemma_xray.web.openai.protocol import ChatCompletionResponse, ModelCard, ModelList

register_any_path()  # "{x:any_path}": the rest of a path, line breaks included (Starlette's ":path" stops at them)
router = APIRouter(route_class=OpenAIRoute, responses=ERROR_RESPONSES)
STREAM: dict[int | str, dict[str, Any]] = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}}


@router.get("/v1/models", response_model=ModelList)
async def list_models(raw_request: Request):
    await OpenAIState.of(raw_request).login(raw_request)
    return JSONResponse(OpenAIState.of(raw_request).models.list().model_dump())


@router.get("/v1/models/{model_id:any_path}", response_model=ModelCard)
async def retrieve_model(model_id: str, raw_request: Request):
    await OpenAIState.of(raw_request).login(raw_request)
    return JSONResponse(OpenAIState.of(raw_request).models.retrieve(model_id).model_dump())


@router.post(
    "/v1/chat/completions", response_model=ChatCompletionResponse, responses=STREAM, openapi_extra=CHAT_REQUEST_BODY
)
async def create_chat_completion(raw_request: Request):
    state = OpenAIState.of(raw_request)
    user = await state.login(raw_request)
    request = await state.body.chat_request(raw_request)
    answer = await state.chat.create_chat_completion(request, raw_request, user)
    if isinstance(answer, ChatCompletionResponse):
        return JSONResponse(answer.model_dump())
    return StreamingResponse(answer, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/v1/openapi.json", include_in_schema=False)
async def openapi_schema():
    return JSONResponse(openapi_document(router.routes))


@router.api_route("/v1/{path:any_path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
async def no_such_route(path: str, raw_request: Request):
    # scope["path"], not url.path: url.path drops line breaks, and "/v1/chat%0A/completions" is no route
    raise not_a_route(raw_request.method, raw_request.scope["path"], router.routes)
