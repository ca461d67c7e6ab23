"""What every API route shares at the HTTP edge: OpenAI-shaped refusals for whatever a route raises, the body read
under a size limit and validated by the typed request, and the API's own OpenAPI document.

The body is parsed by pydantic's JSON parser straight into the typed request (no Python dict in between): JSON
nested 100,000 deep or a lone surrogate ("\\ud800") is a 400 naming the problem, never a RecursionError, a
UnicodeEncodeError later, or a 500.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi.routing import APIRoute

from medgemma_xray.web.openai.errors import ApiError, from_service, from_validation
from medgemma_xray.web.openai.protocol import ChatCompletionRequest, ErrorResponse

if TYPE_CHECKING:
    from anyio import CapacityLimiter

logger = logging.getLogger(__name__)

JSON_OVERHEAD_BYTES = 1 << 20  # the messages around the film; questions are bounded far below this
PARSE_IN_THREAD_BYTES = 64 << 10  # a larger body (a film) is parsed off the event loop
PARSES_AT_ONCE = 4
OPENAPI_TITLE = "MedGemma X-Ray assistant: OpenAI-compatible API"
OPENAPI_VERSION = "1"

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "The request is malformed or asks for something this server does not do; `param` names the field."),
        (401, "A login is configured: send 'name:password' as the bearer token."),
        (404, "No such model or route."),
        (405, "The route exists with another method."),
        (409, "An answer in this conversation is still running."),
        (413, "The body is larger than the transport limit (the film's size limit plus 1 MiB)."),
        (429, "This client asked too often."),
        (500, "A fault of the server, with an incident number; the server keeps running."),
        (503, "The queue is full (server_busy) or no model serves now (unavailable); see Retry-After."),
        (504, "The answer did not finish within the server's time limit."),
    )
}


class OpenAIRoute(APIRoute):
    """A route whose every refusal, its own or FastAPI's, is in OpenAI's error shape."""

    def get_route_handler(self):
        from fastapi.exceptions import RequestValidationError
        from starlette.exceptions import HTTPException

        handler = super().get_route_handler()

        async def answer_in_openai_shape(request):
            try:
                return await handler(request)
            except ApiError as exc:
                return exc.response()
            except RequestValidationError as exc:
                errors = exc.errors()
                param = ".".join(str(part) for part in errors[0]["loc"][1:]) if errors else None
                return ApiError(400, f"Invalid value for '{param}'.", param=param).response()
            except HTTPException as exc:
                return ApiError(exc.status_code, str(exc.detail)).response()
            except Exception as exc:  # a fault of ours: an incident number, never a traceback
                return from_service(exc).response()

        return answer_in_openai_shape


def register_any_path() -> None:
    """A path convertor that takes the rest of a path whatever it holds. Starlette's ":path" is ".*", which stops
    at a line break, so /v1/models/a%0Ab matched no API route and reached Gradio's {"detail": "Not Found"}."""
    from starlette.convertors import PathConvertor, register_url_convertor

    class AnyPath(PathConvertor):
        regex = r"[\s\S]*"

    register_url_convertor("any_path", AnyPath())


class BodyReader:
    """A chat request's body, read under a size limit and parsed into the typed request. A large body (one that
    carries a film) is parsed on a worker thread, at most PARSES_AT_ONCE at a time: parsing holds the body twice
    more (pydantic's string and Python's), and forty requests with a 6000 x 6000 film at once must not."""

    def __init__(self, settings) -> None:
        self.max_bytes = settings.max_file_size_bytes * 4 // 3 + JSON_OVERHEAD_BYTES
        self._limiter: CapacityLimiter | None = None  # made on the event loop

    async def chat_request(self, request) -> ChatCompletionRequest:
        from pydantic import ValidationError

        body = await read_body(request, self.max_bytes)
        try:
            if len(body) < PARSE_IN_THREAD_BYTES:
                return ChatCompletionRequest.model_validate_json(body)
            import anyio

            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(PARSES_AT_ONCE)
            return await anyio.to_thread.run_sync(
                ChatCompletionRequest.model_validate_json, body, limiter=self._limiter
            )
        except ValidationError as exc:
            raise from_validation(exc) from None


async def read_body(request, max_bytes: int) -> bytearray:
    """The request body (one buffer, grown in place: never held twice), refused with 413 as soon as it is known to
    exceed max_bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > max_bytes:
            raise too_large(max_bytes)
        body += chunk
    return body


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"The request is larger than {max_bytes / 2**20:.0f} MiB; send one film per request, within MAX_FILE_SIZE_MB.",
        code="request_too_large",
    )


def openapi_document(routes) -> dict[str, Any]:
    """The API routes' OpenAPI document (FastAPI's own /openapi.json is off: it would describe Gradio's routes).
    The chat route reads its body itself (under a size limit), so its typed request is added to the document here
    rather than read from the handler's signature."""
    from fastapi.openapi.utils import get_openapi

    document = get_openapi(title=OPENAPI_TITLE, version=OPENAPI_VERSION, routes=list(routes))
    schema = ChatCompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(schema.pop("$defs", {}))
    schemas["ChatCompletionRequest"] = schema
    return document


def not_a_route(method: str, path: str, routes) -> ApiError:
    """OpenAI's answer to a URL it does not serve; a route that exists with another method is a 405."""
    allowed = sorted(
        method
        for route in routes
        if isinstance(route, APIRoute) and route.include_in_schema and route.path == path
        for method in route.methods or ()
    )
    if allowed:
        return ApiError(
            405,
            f"{method} is not allowed on {path}; use {' or '.join(allowed)}.",
            headers={"Allow": ", ".join(allowed)},
            code="method_not_allowed",
        )
    return ApiError(
        404, f"Invalid URL ({method} {path}): this server has no such route (see /v1/openapi.json).", code="unknown_url"
    )


CHAT_REQUEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}},
    }
}
