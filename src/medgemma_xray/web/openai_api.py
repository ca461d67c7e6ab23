"""OpenAI-compatible chat API on the same server, service, limits, login and logging rules as the UI.

    POST /v1/chat/completions   (stream or not; the film as an image_url data: URL: PNG, JPEG or application/dicom)
    GET  /v1/models

Why this shape: Vertex AI's MedGemma endpoints and vLLM speak this API, so clients, evaluation harnesses and routers
work unchanged. What differs from OpenAI, on purpose:
- The server fetches nothing: an http(s) image URL is refused; send the film inline (data: URL, base64). Its bytes
  are sniffed and loaded by xray_io under the UI's limits (MAX_FILE_SIZE_MB, MAX_PIXELS), whatever type it claims.
- One film per conversation, in the first user message (MedGemma's chat format puts the image there).
- Decoding is greedy (as in Google's MedGemma examples): temperature and top_p are accepted and do not change it;
  n > 1 and top_logprobs > 1 are refused, since they would only repeat the same answer or invent alternatives.
- Extension fields: the request may carry "conversation_id" (the server keeps that conversation's KV between turns,
  and a scale-out router keeps it on one replica); the response carries "medgemma": {confidence, reused_tokens,
  warnings, ...}. usage.prompt_tokens_details.cached_tokens is the reused-token count too.
- With a login file (AUTH_FILE), the API key is "name:password" of a login user, sent as a bearer token.
Logs get the request's shape (stream, sizes, error class), never a file's name, its tags or the question's text.
"""

# No "from __future__ import annotations": FastAPI reads the route handlers' annotations (Request), which are
# imported lazily inside add_openai_routes and so must be evaluated where the handlers are defined.

import base64
import binascii
import hashlib
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from medgemma_xray.inference_api.errors import RequestError
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats

if TYPE_CHECKING:
    from medgemma_xray.serving.surface import InferenceSurface

logger = logging.getLogger(__name__)

RETRY_AFTER_BUSY_S = 60  # as the UI's busy answer (medgemma_xray.web.http_guards.RETRY_AFTER_S)
RETRY_AFTER_UNAVAILABLE_S = 10
OWNED_BY = "medgemma-xray-assistant"
JSON_OVERHEAD_BYTES = 1 << 20  # the messages around the film; questions are bounded far below this
ACCEPTED_IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg", "application/dicom", "application/octet-stream")


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}, with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}


@dataclass
class ChatCall:
    """A validated /v1/chat/completions request, ready for the service."""

    request: GenerationRequest
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    warnings: tuple[str, ...] = field(default=())


def served_model_name(info) -> str:
    """The id /v1/models lists: the checkpoint's model id, never a server path."""
    if info is None:
        return "medgemma"
    model_id = str(info.model_id)
    return model_id.rstrip("/").rsplit("/", 1)[-1] if model_id.startswith(("/", ".")) else model_id


# --- request parsing ---------------------------------------------------------------------------------------------
def decode_data_url(url: object, max_bytes: int) -> bytes:
    """The bytes of a base64 data: URL. Refuses every other scheme: the server fetches nothing."""
    if not isinstance(url, str) or not url:
        raise ApiError(400, "image_url.url must be a data: URL string.", param="messages", code="invalid_image_url")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https", "ftp", "file", "gs", "s3"):
        raise ApiError(
            400,
            f"Remote image URLs ({scheme}://) are refused: this server fetches nothing. Send the film inline as a "
            "data: URL, e.g. data:application/dicom;base64,<the file in base64>.",
            param="messages",
            code="remote_image_url_refused",
        )
    header, comma, payload = url.partition(",")
    if scheme != "data" or not comma:
        raise ApiError(
            400,
            "image_url.url must be a data: URL (data:image/png;base64,..., data:image/jpeg;base64,... or "
            "data:application/dicom;base64,...).",
            param="messages",
            code="invalid_image_url",
        )
    parts = [part.strip().lower() for part in header[len("data:") :].split(";")]
    if "base64" not in parts[1:]:
        raise ApiError(400, "The data: URL must be base64-encoded (data:<type>;base64,...).", code="invalid_image_url")
    if parts[0] and parts[0] not in ACCEPTED_IMAGE_TYPES:
        raise ApiError(
            400,
            f"The data: URL declares {parts[0]!r}; send a chest film as image/png, image/jpeg or application/dicom.",
            param="messages",
            code="unsupported_image_type",
        )
    if len(payload) > (max_bytes // 3 + 1) * 4 + 4:
        raise ApiError(
            413,
            f"The film is larger than the {max_bytes / 2**20:g} MiB limit. Export a single film at a lower size.",
            param="messages",
            code="image_too_large",
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(
            400, "The data: URL's base64 payload is damaged; encode the file again.", code="invalid_image_url"
        ) from None


def _text_and_images(content: object, role: str, index: int) -> tuple[str, list[object]]:
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise ApiError(400, f"messages[{index}].content must be a string or a list of parts.", param="messages")
    texts: list[str] = []
    images: list[object] = []  # image references as sent; checked where they are read
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url" and role == "user":
            image = part.get("image_url")
            images.append(image.get("url") if isinstance(image, dict) else image)
        elif kind == "image_url":
            raise ApiError(400, f"messages[{index}]: only a user message may carry the film.", param="messages")
        else:
            raise ApiError(
                400,
                f"messages[{index}] has a content part of type {kind!r}; use 'text' and 'image_url' parts.",
                param="messages",
            )
    return "\n".join(texts), images


def parse_chat_request(
    body: object, settings, limits, model_name: str, load_film: Callable[[bytes], tuple]
) -> ChatCall:
    """Validate an OpenAI chat request against the server's limits. load_film(bytes) -> (model image, warnings,
    content hash). Raises ApiError with a message that says what to change."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if model != model_name:
        raise ApiError(
            404,
            f"The model {model!r} does not exist here; this server serves {model_name!r} (see GET /v1/models).",
            param="model",
            code="model_not_found",
        )
    if body.get("n", 1) != 1:
        raise ApiError(400, "n must be 1: decoding is greedy, so more choices would repeat the same answer.", param="n")
    if body.get("tools") or body.get("functions"):
        raise ApiError(400, "Tools and functions are not supported by this model server.", param="tools")
    top_logprobs = body.get("top_logprobs") or 0
    if not isinstance(top_logprobs, int) or not 0 <= top_logprobs <= 1:
        raise ApiError(
            400,
            "top_logprobs must be 0 or 1: only the chosen token's log-probability is available (decoding is greedy).",
            param="top_logprobs",
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = settings.max_new_tokens if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= settings.max_new_tokens:
        raise ApiError(
            400,
            f"max_tokens must be an integer in 1..{settings.max_new_tokens} (this server's MAX_NEW_TOKENS).",
            param="max_tokens",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list.", param="messages")
    system_prompt: str | None = None
    turns: list[ChatTurn] = []
    image_urls: list[object] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant"):
            raise ApiError(400, f"messages[{index}].role must be system, user or assistant.", param="messages")
        text, images = _text_and_images(message.get("content"), role, index)
        if role in ("system", "developer"):
            if index != 0:
                raise ApiError(400, "Only the first message may be a system message.", param="messages")
            system_prompt = text
            continue
        if images and turns:
            raise ApiError(
                400, "Put the film in the first user message (MedGemma's chat format has it there).", param="messages"
            )
        image_urls.extend(images)
        turns.append(ChatTurn(role, text))
    if len(image_urls) != 1:
        raise ApiError(
            400,
            "Send exactly one chest film, as an image_url part of the first user message "
            f"(found {len(image_urls)}): this assistant answers about one film per conversation.",
            param="messages",
            code="one_film_required",
        )
    if not turns or turns[-1].role != "user":
        raise ApiError(400, "The last message must be the user's question.", param="messages")
    extra = {"system_prompt": system_prompt} if system_prompt is not None else {}
    # web.asking's rules on the whole conversation (every turn, markers, total tokens), before the film is decoded
    limits.check(GenerationRequest(image=None, turns=tuple(turns), max_new_tokens=max_tokens, **extra))
    data = decode_data_url(image_urls[0], settings.max_file_size_bytes)
    image, warnings, image_hash = load_film(data)
    conversation = body.get("conversation_id")
    if conversation is not None and (not isinstance(conversation, str) or not 1 <= len(conversation) <= 128):
        raise ApiError(400, "conversation_id must be a string of 1 to 128 characters.", param="conversation_id")
    stream_options = body.get("stream_options") or {}
    request = GenerationRequest(
        image=image,
        turns=tuple(turns),
        max_new_tokens=max_tokens,
        conversation_id=conversation,
        image_key=image_hash,
        **extra,
    )
    try:
        request.validate()
    except RequestError as exc:
        raise ApiError(400, str(exc), param="messages") from None
    return ChatCall(
        request=request,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
        logprobs=bool(body.get("logprobs", False)),
        top_logprobs=top_logprobs,
        warnings=tuple(warnings),
    )


def film_loader(settings, intake=None) -> Callable[[bytes], tuple]:
    """bytes -> (the model's input image, the film's warnings, a content hash of that image), through the server's
    one film intake (medgemma_xray.intake: its decoded-film cache and its bound on concurrent decodes). The image
    is shared between requests that sent the same bytes: read it, never change it."""
    from medgemma_xray.intake import FilmIntake, FilmRefused

    intake = intake if intake is not None else FilmIntake.for_settings(settings)

    def load(data: bytes) -> tuple:
        try:
            film = intake.read(data)
        except FilmRefused as exc:
            raise ApiError(exc.http_status, str(exc), param="messages", code=exc.code) from None
        return film.model_image, film.warnings, film.image_key

    return load


# --- answers ------------------------------------------------------------------------------------------------------
def logprob_entries(stats: GenerationStats, start: int, end: int, top: int) -> list[dict]:
    entries = []
    for index in range(start, end):
        text, logprob = stats.token_texts[index], float(stats.token_logprobs[index])
        entry = {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
        if top:
            entry["top_logprobs"] = [{"token": text, "logprob": logprob, "bytes": list(text.encode())}]
        entries.append(entry)
    return entries


def extension(stats: GenerationStats, call: ChatCall, replica: str | None, received: float | None = None) -> dict:
    from medgemma_xray.assistant.confidence import answer_confidence

    confidence = answer_confidence(stats.token_ids, stats.token_logprobs, stats.token_texts)
    result: dict[str, Any] = {
        "confidence": confidence.to_dict() if confidence else None,
        "reused_tokens": stats.reused_tokens,
        "decoding": "greedy",
        "warnings": list(call.warnings),
    }
    times = stats.token_times
    if received is not None and times:  # this server's clock: from the request's arrival to the first token
        result["ttft_s"] = times[0] - received
        result["decode_ms_per_token"] = (times[-1] - times[0]) / (len(times) - 1) * 1e3 if len(times) > 1 else None
    if replica is not None:
        result["replica"] = replica
    return result


def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": stats.prompt_tokens + stats.new_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
    }


class TokenCursor:
    """Which generated tokens a streamed text prefix covers: stats (filled on the scheduler's thread) can run ahead
    of the text handed to us, so tokens are released only once their text has been sent."""

    def __init__(self, stats: GenerationStats) -> None:
        self.stats, self.sent_tokens, self.covered_chars = stats, 0, 0

    def release(self, text_length: int, final: bool = False) -> tuple[int, int]:
        start, texts = self.sent_tokens, self.stats.token_texts
        available = min(len(texts), len(self.stats.token_logprobs))
        while self.sent_tokens < available:
            width = len(texts[self.sent_tokens])
            if not final and self.covered_chars + width > text_length:
                break
            self.covered_chars += width
            self.sent_tokens += 1
        return start, self.sent_tokens


class BearerCheck:
    """The UI's login as a bearer token "name:password". Verified tokens are remembered by their SHA-256 for a few
    minutes, so a streaming client does not pay scrypt on every request."""

    def __init__(self, auth: Callable[[str, str], bool] | None, remember_s: float = 300.0) -> None:
        self.auth, self.remember_s = auth, remember_s
        self._verified: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def user(self, authorization: str | None) -> str | None:
        """The user name; None when no login is configured. Raises ApiError 401 otherwise."""
        if self.auth is None:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        name, colon, password = token.strip().partition(":")
        if scheme.lower() != "bearer" or not colon or not name:
            raise ApiError(
                401,
                "This server requires a login: send the API key 'name:password' of a login user as a bearer token.",
                kind="authentication_error",
                code="invalid_api_key",
            )
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            known = self._verified.get(digest)
            if known is not None and now - known[1] < self.remember_s:
                return known[0]
        if not self.auth(name, password):
            logger.warning("API login refused")
            raise ApiError(
                401, "The API key (name:password) is not valid.", kind="authentication_error", code="invalid_api_key"
            )
        with self._lock:
            self._verified[digest] = (name, now)
            while len(self._verified) > 256:
                self._verified.popitem(last=False)
        return name


def scoped_conversation(conversation_id: str | None, user: str | None) -> str | None:
    """Conversation ids are the client's; scoped by login user, so one user's id never touches another's KV."""
    if conversation_id is None:
        return None
    return "api-" + hashlib.sha256(f"{user or ''}\0{conversation_id}".encode()).hexdigest()[:32]


def service_error(exc: BaseException, service: "InferenceSurface") -> ApiError:
    """The service's refusals in OpenAI's shape: a full queue is 429, a server not ready (or a lost replica) 503."""
    from medgemma_xray.serving.service import ServiceUnavailable
    from medgemma_xray.web.asking import AskRefused, to_openai

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, AskRefused):
        status, body, headers = to_openai(exc)
        error = body["error"]
        return ApiError(status, error["message"], kind=error["type"], code=error["code"], param=error["param"],
                        retry_after_s=exc.retry_after_s)  # fmt: skip
    if isinstance(exc, RequestError):
        return ApiError(400, str(exc), param="messages")
    if isinstance(exc, ServiceUnavailable):
        busy = "busy" in str(exc) and service.ready.is_set()
        return ApiError(
            429 if busy else 503,
            str(exc),
            kind="rate_limit_error" if busy else "service_unavailable",
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


# --- the routes ---------------------------------------------------------------------------------------------------
def add_openai_routes(api, service: "InferenceSurface", auth: Callable[[str, str], bool] | None = None) -> None:
    """Add /v1/models and /v1/chat/completions to the FastAPI app (before Gradio is mounted at /)."""
    import anyio
    from fastapi import Request
    from fastapi.responses import JSONResponse, StreamingResponse

    from medgemma_xray.web.asking import Asking

    settings = service.settings
    asking = Asking.for_service(service)  # the pages' own: one set of rules and locks for every door
    load_film = film_loader(settings)
    bearer = BearerCheck(auth)
    # Each waiting or running answer blocks one worker thread on its next token; more than the service can hold
    # wait here instead of starving the server's shared pool.
    threads = anyio.CapacityLimiter(settings.generation_concurrency + settings.queue_size + 4)
    max_body = settings.max_file_size_bytes * 4 // 3 + JSON_OVERHEAD_BYTES

    def error_response(error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers())

    @api.get("/v1/models")
    def list_models(request: Request):
        try:
            bearer.user(request.headers.get("authorization"))
        except ApiError as exc:
            return error_response(exc)
        created = int(getattr(service, "started_at", time.time()))
        model = {"id": served_model_name(service.info()), "object": "model", "created": created, "owned_by": OWNED_BY}
        return {"object": "list", "data": [model]}

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        received = time.perf_counter()
        try:
            user = bearer.user(request.headers.get("authorization"))
            body = await _read_json(request, max_body)
            call = await anyio.to_thread.run_sync(
                parse_chat_request, body, settings, asking, served_model_name(service.info()), load_film
            )
        except ApiError as exc:
            return error_response(exc)
        except RequestError as exc:  # the limits' refusals
            return error_response(service_error(exc, service))
        conversation = scoped_conversation(call.request.conversation_id, user)
        call.request = _with_conversation(call.request, conversation)
        try:
            ticket = asking.claim(conversation)
        except RequestError as exc:
            return error_response(service_error(exc, service))
        stats = GenerationStats()
        answer = service.stream_answer(call.request, stats)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        model_name = served_model_name(service.info())
        logger.info(
            "chat completion: stream=%s turns=%d max_tokens=%d",
            call.stream,
            len(call.request.turns),
            call.request.max_new_tokens,
        )

        async def next_text() -> str | None:
            return await anyio.to_thread.run_sync(next, answer, None, limiter=threads)

        try:
            first = await next_text()  # submits: a full queue or a bad request is refused before any header
        except BaseException as exc:
            answer.close()
            asking.release(ticket)
            if isinstance(exc, Exception):
                return error_response(service_error(exc, service))
            raise
        replica = stats.replica
        if not call.stream:
            try:
                text = first or ""
                while (more := await next_text()) is not None:
                    text = more
            except Exception as exc:
                return error_response(service_error(exc, service))
            finally:
                answer.close()
                asking.release(ticket)
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": stats.finish_reason or "stop", "logprobs": None}
            if call.logprobs:
                choice["logprobs"] = {"content": logprob_entries(stats, 0, stats.new_tokens, call.top_logprobs)}
            return {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [choice],
                "usage": usage(stats),
                "medgemma": extension(stats, call, stats.replica or replica, received),
            }

        async def events() -> AsyncIterator[bytes]:
            cursor, sent = TokenCursor(stats), ""
            base = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model_name,
            }

            def chunk(delta: dict, finish: str | None = None, logprobs: list | None = None, **extra) -> bytes:
                choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                if call.logprobs and logprobs is not None:
                    choice["logprobs"] = {"content": logprobs}
                return b"data: " + json.dumps({**base, "choices": [choice], **extra}).encode() + b"\n\n"

            try:
                yield chunk({"role": "assistant", "content": ""})
                text = first
                while text is not None:
                    start, end = cursor.release(len(text))
                    if len(text) > len(sent) or end > start:
                        yield chunk(
                            {"content": text[len(sent) :]},
                            logprobs=logprob_entries(stats, start, end, call.top_logprobs),
                        )
                        sent = text
                    text = await next_text()
                start, end = cursor.release(len(sent), final=True)
                medgemma = extension(stats, call, stats.replica or replica, received)
                yield chunk(
                    {},
                    stats.finish_reason or "stop",
                    logprobs=logprob_entries(stats, start, end, call.top_logprobs),
                    medgemma=medgemma,
                )
                if call.include_usage:
                    yield b"data: " + json.dumps({**base, "choices": [], "usage": usage(stats)}).encode() + b"\n\n"
            except Exception as exc:  # after the headers: the error goes in the stream, as vLLM and OpenAI do
                yield b"data: " + json.dumps(service_error(exc, service).body()).encode() + b"\n\n"
            finally:
                answer.close()  # a closed connection cancels the answer: its slot frees at the scheduler's next turn
                asking.release(ticket)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _with_conversation(request: GenerationRequest, conversation_id: str | None) -> GenerationRequest:
    from dataclasses import replace

    return replace(request, conversation_id=conversation_id)


async def _read_json(request, max_body: int) -> object:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        raise ApiError(413, f"The request is larger than {max_body / 2**20:.0f} MiB; send one film per request.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            raise ApiError(413, f"The request is larger than {max_body / 2**20:.0f} MiB; send one film per request.")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.") from None
