"""Every refusal of the API in OpenAI's error shape, {"error": {"message", "type", "param", "code"}}, with its status.

One table of statuses, used by every route:
- 400 invalid_request_error: anything wrong with the request, the film included (codes name which: invalid_image,
  not_a_chest_film, image_too_large, ...). Malformed, too deeply nested or surrogate-carrying JSON is a 400 too.
- 401 authentication_error; 404 (an unknown model or route); 405 for a wrong method; 409 conversation_busy (one
  answer at a time per conversation); 413 for a body over the transport limit.
- 429 rate_limit_error: this client asked more often than QUESTIONS_PER_MINUTE (web.asking's throttling).
- 503 service_unavailable: the server's queue is full (server_busy) or no model serves now (unavailable); both
  carry Retry-After. 503, not 429, because a full queue is the server's shared capacity, not this client's rate:
  the UI, Gradio's queue and uvicorn's connection limit answer 503 too, and routers in front of several replicas
  (KServe, llm-d, Envoy's retry policies) send a 503'd request to another replica.
- 504 timeout_error: the answer did not finish within REQUEST_TIMEOUT_S.
- 500 server_error: a fault of ours, with an incident number in the log; never a traceback to the client.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from medgemma_xray.inference_api.errors import RequestError
from medgemma_xray.web.openai.protocol import ErrorDetail, ErrorResponse

if TYPE_CHECKING:
    from pydantic import ValidationError

logger = logging.getLogger(__name__)

RETRY_AFTER_BUSY_S = 60  # as the UI's busy answer (medgemma_xray.web.http_guards.RETRY_AFTER_S)
RETRY_AFTER_UNAVAILABLE_S = 10
TAGS = {"system", "developer", "user", "assistant", "text", "image_url", "refusal"}  # discriminator values in locs


class ApiError(Exception):
    """A refusal with its HTTP status, in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        message, param = _text(message), _text(param) if param is not None else None
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param
        self.extra_headers = dict(headers or {})
        if retry_after_s is not None:
            self.extra_headers["Retry-After"] = str(retry_after_s)

    def body(self) -> dict[str, Any]:
        detail = ErrorDetail(message=self.message, type=self.kind, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump()

    def body_json(self) -> str:
        detail = ErrorDetail(message=self.message, type=self.kind, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump_json()

    def response(self):
        from fastapi.responses import JSONResponse

        return JSONResponse(self.body(), status_code=self.status, headers=self.extra_headers)


def _text(value: str) -> str:
    """What can be sent as UTF-8: a lone surrogate from a URL or a header becomes "?"."""
    return value.encode("utf-8", "replace").decode("utf-8")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def param_path(loc: tuple[int | str, ...]) -> str | None:
    """A pydantic error location as OpenAI names parameters: messages[0].content[1].image_url.url. Union member
    labels ("str", "list[...]") and discriminator tags ("user", "image_url" right after an index) are left out."""
    path = ""
    after_index = False
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            after_index = True
            continue
        if (after_index and part in TAGS) or "[" in part or part in ("str", "int", "float", "bool", "none"):
            after_index = False
            continue
        after_index = False
        path += f".{part}" if path else part
    return path or None


def from_validation(exc: ValidationError) -> ApiError:
    """The most specific of pydantic's errors as one 400 naming the parameter (a union reports one error per
    member; the deepest is the one that says what is wrong)."""
    errors = exc.errors(include_url=False, include_input=False)
    error = max(errors, key=lambda item: len(item["loc"]))
    kind, loc = error["type"], tuple(error["loc"])
    param = param_path(loc)
    if kind == "json_invalid":
        detail = error["msg"].removeprefix("Invalid JSON: ")
        if "escape" in detail:  # pydantic's parser names a lone surrogate only as a bad escape
            detail += ", such as a lone surrogate (\\ud800-\\udfff), which is not text"
        return bad_request(
            f"The request body is not valid JSON ({detail}). Send one JSON object in UTF-8, nested at most a few "
            "hundred levels.",
            code="invalid_json",
        )
    if kind == "union_tag_invalid":  # an unknown role or content part type
        param = f"{param}.{str(error['ctx']['discriminator']).strip(chr(39))}"
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter")
    if kind == "missing":
        hint = " (GET /v1/models lists this server's model)" if param == "model" else ""
        return bad_request(
            f"Missing required parameter: '{param}'{hint}.", param=param, code="missing_required_parameter"
        )
    if kind == "unsupported_parameter":
        return bad_request(error["msg"], param=param, code="unsupported_parameter")
    if kind in ("model_type", "dict_type") and not loc:
        return bad_request("The request body must be a JSON object.", code="invalid_json")
    where = f"'{param}'" if param else "the request"
    return bad_request(f"Invalid value for {where}: {error['msg']}.", param=param, code="invalid_value")


def from_asking(exc) -> ApiError:
    """web.asking's refusals (the rules of a conversation, one answer at a time, throttling) as web.asking's own
    adapter shapes them for OpenAI."""
    from medgemma_xray.web.asking import to_openai

    status, body, headers = to_openai(exc)
    error = body["error"]
    return ApiError(
        status, error["message"], kind=error["type"], code=error["code"], param=error["param"], headers=headers
    )


def from_service(exc: BaseException) -> ApiError:
    """The service's refusals and failures, by whose they are: the request's (400), the server's capacity (503),
    time (504), or a fault (500 with an incident number)."""
    from starlette.requests import ClientDisconnect

    from medgemma_xray.serving.scheduler import AnswerTimeoutError
    from medgemma_xray.serving.service import ServiceUnavailable
    from medgemma_xray.web.asking import AskRefused

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ClientDisconnect):
        # The client hung up before its request was read (a slow client the server closed, or one that gave up):
        # nobody reads this answer, and it is no fault of the server's, so it is no internal error in the log.
        logger.info("API client closed the connection before its request was read")
        return bad_request("The request ended before its body was complete.", code="incomplete_request")
    if isinstance(exc, AskRefused):
        return from_asking(exc)
    if isinstance(exc, RequestError):
        return bad_request(str(exc), param="messages", code="invalid_conversation")
    timeout = exc if isinstance(exc, AnswerTimeoutError) else exc.__cause__
    if isinstance(timeout, AnswerTimeoutError):
        return ApiError(
            504,
            f"No answer in time: {timeout}. Ask for fewer tokens (max_completion_tokens), or retry when the server "
            "is less busy.",
            kind="timeout_error",
            code="answer_timeout",
        )
    if isinstance(exc, ServiceUnavailable):
        busy = "busy" in str(exc)
        return ApiError(
            503,
            str(exc),
            kind="service_unavailable",
            code="server_busy" if busy else "unavailable",
            retry_after_s=RETRY_AFTER_BUSY_S if busy else RETRY_AFTER_UNAVAILABLE_S,
        )
    incident = uuid.uuid4().hex[:8]
    logger.error("API internal error %s: %s", incident, type(exc).__name__)
    return ApiError(
        500,
        f"Internal error (incident {incident}); the server is still running. Retry; if it happens again, give the "
        "incident number to the operator.",
        kind="server_error",
        code="internal_error",
    )
