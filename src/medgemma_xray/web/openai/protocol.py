"""The OpenAI chat-completions wire format, typed: what a request may carry and what the server answers.

Request fields follow OpenAI's reference for POST /v1/chat/completions, in its order. Each one is honoured, or
refused by a validator here with a 400 that names it; none is silently ignored where it would change the answer:
- decoding is greedy (as in Google's MedGemma examples), so temperature must be 0 or left out; top_p is honoured
  as it stands (the most likely token is inside every nucleus) and so is seed (greedy answers repeat exactly);
- stop strings end the answer; response_format "text" is the only format; n is 1;
- tools, audio, penalties, logit_bias and stored completions are refused by name;
- metadata, user, safety_identifier, prompt_cache_key, service_tier and parallel_tool_calls change nothing here
  and are accepted, as OpenAI documents them as hints.
An unknown field is refused with OpenAI's own words ("Unrecognized request argument supplied").

This server's own additions are in one place: MedGemmaExtras (the request) and the `medgemma` objects of the
answer and the model card. Nothing else here differs from OpenAI's shapes.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

INT64 = 2**63
MAX_STOP_STRINGS = 4  # as OpenAI
MAX_STOP_CHARS = 256  # each; held back from a stream until it can no longer start a stop string
MAX_CONVERSATION_ID_CHARS = 128


def refused(field: str, why: str) -> PydanticCustomError:
    """A request field this server will not honour; the message names the field and what to send instead."""
    return PydanticCustomError("unsupported_parameter", "{field}: {why}", {"field": field, "why": why})


class RequestModel(BaseModel):
    """Requests refuse what they do not know: a typo'd field never passes as "accepted"."""

    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- messages -----------------------------------------------------------------------------------------------------
class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class ImageURL(RequestModel):
    url: str = Field(description="The film inline as a base64 data: URL (PNG, JPEG or application/dicom).")
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(RequestModel):
    type: Literal["image_url"]
    image_url: ImageURL


class RefusalPart(RequestModel):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class SystemMessage(RequestModel):
    """Its text goes before the first user turn, as MedGemma's chat template does with a system turn."""

    role: Literal["system", "developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(RequestModel):
    role: Literal["user"]
    content: str | list[UserPart]
    name: str | None = None


class AssistantMessage(RequestModel):
    """An earlier answer, as a client replays it; the fields OpenAI's own answers carry are accepted when empty."""

    role: Literal["assistant"]
    content: str | list[AssistantPart] | None = None
    name: str | None = None
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _no_tool_calls(self) -> AssistantMessage:
        if self.tool_calls or self.function_call or self.audio:
            raise refused("tool_calls", "this model server has no tools or audio, so no answer can carry them")
        return self


Message = Annotated[SystemMessage | UserMessage | AssistantMessage, Field(discriminator="role")]


def message_text(content: str | list | None) -> str:
    """A message's text parts joined by new lines (image parts are the film, read elsewhere)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        part.text if isinstance(part, TextPart) else part.refusal for part in content if not isinstance(part, ImagePart)
    )


def message_images(message: SystemMessage | UserMessage | AssistantMessage) -> list[str]:
    if not isinstance(message, UserMessage) or isinstance(message.content, str):
        return []
    return [part.image_url.url for part in message.content if isinstance(part, ImagePart)]


# --- the request --------------------------------------------------------------------------------------------------
class StreamOptions(RequestModel):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # OpenAI pads chunks against length side channels; nothing to pad here


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise refused(
                "response_format",
                f"{value!r} is not available: this server cannot constrain the answer "
                'to JSON. Send {"type": "text"} or leave response_format out.',
            )
        return value


class MedGemmaExtras(RequestModel):
    """This server's own request fields (send them with the openai client's extra_body)."""

    conversation_id: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CONVERSATION_ID_CHARS,
        description=(
            "Keep this conversation's state between turns. Send the id a previous answer returned in "
            "medgemma.conversation_id; any other string starts a new kept conversation and the answer returns its "
            "id. Ids are signed and bound to the client (its login when one is on)."
        ),
    )


class ChatCompletionRequest(MedGemmaExtras):
    messages: list[Message] = Field(min_length=1)
    model: str
    audio: dict[str, Any] | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    function_call: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    logit_bias: dict[str, int] | None = None
    logprobs: bool | None = False
    max_completion_tokens: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1, description="Deprecated by OpenAI for max_completion_tokens.")
    metadata: dict[str, str] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    n: int | None = 1
    parallel_tool_calls: bool | None = None
    prediction: dict[str, Any] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    prompt_cache_key: str | None = None
    reasoning_effort: str | None = None
    response_format: ResponseFormat | None = None
    safety_identifier: str | None = None
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    stop: str | list[str] | None = None
    store: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    top_p: float | None = Field(None, ge=0, le=1)
    user: str | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    web_search_options: dict[str, Any] | None = None

    # --- what greedy decoding of one text answer cannot honour, refused by name ---------------------------------
    @field_validator("temperature")
    @classmethod
    def _greedy(cls, value: float | None) -> float | None:
        if value:
            raise refused(
                "temperature",
                f"{value:g} asks for sampling, but this server decodes greedily (as Google's MedGemma examples do). "
                "Send temperature 0 or leave it out.",
            )
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise refused("n", "must be 1: decoding is greedy, so more choices would repeat the same answer")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _chosen_token_only(cls, value: int | None) -> int | None:
        if value is not None and value > 1:
            raise refused(
                "top_logprobs",
                "must be 0 or 1: decoding is greedy, so only the chosen token's log-probability is computed",
            )
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else (value or [])
        if len(strings) > MAX_STOP_STRINGS:
            raise refused("stop", f"at most {MAX_STOP_STRINGS} stop strings are accepted")
        if any(not 1 <= len(text) <= MAX_STOP_CHARS for text in strings):
            raise refused("stop", f"each stop string must have 1 to {MAX_STOP_CHARS} characters")
        return value

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalties(cls, value: float | None, info) -> float | None:
        if value:
            raise refused(info.field_name, "penalties change sampling, and this server decodes greedily; send 0")
        return value

    @field_validator("logit_bias", "functions", "tools", "audio", "prediction", "web_search_options")
    @classmethod
    def _not_offered(cls, value: Any, info) -> Any:
        if value:
            raise refused(info.field_name, "is not offered by this model server; leave it out")
        return value

    @field_validator("function_call", "tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: Any, info) -> Any:
        if value not in (None, "none"):
            raise refused(info.field_name, 'this model server has no tools; leave it out or send "none"')
        return value

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, value: list[str] | None) -> list[str] | None:
        if value and value != ["text"]:
            raise refused("modalities", 'this model answers in text only; send ["text"] or leave it out')
        return value

    @field_validator("reasoning_effort", "verbosity")
    @classmethod
    def _not_a_reasoning_model(cls, value: str | None, info) -> str | None:
        if value is not None:
            raise refused(info.field_name, "MedGemma is not a reasoning model and has no such setting; leave it out")
        return value

    @field_validator("store")
    @classmethod
    def _nothing_stored(cls, value: bool | None) -> bool | None:
        if value:
            raise refused("store", "this server keeps no completions (nothing a patient's film led to is stored)")
        return value

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> ChatCompletionRequest:
        if self.stream_options is not None and not self.stream:
            raise refused("stream_options", "is only allowed when stream is true")
        return self

    # --- what the serving class reads -----------------------------------------------------------------------------
    @property
    def answer_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


# --- answers ------------------------------------------------------------------------------------------------------
class ErrorDetail(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorDetail


class ModelDescription(ResponseModel):
    """What the model id does not say: what serves it, in words."""

    description: str
    demo: bool
    mode: str
    executor: str
    precision: str
    notice: str | None = None


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    medgemma: ModelDescription | None = None


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(ResponseModel):
    content: list[TokenLogprob] | None = None


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = 0


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class AnswerDetails(ResponseModel):
    """The answer's own figures: how sure the model was, the film's warnings, and how to continue."""

    confidence: dict[str, Any] | None = None
    reused_tokens: int = 0
    decoding: Literal["greedy"] = "greedy"
    warnings: list[str] = Field(default_factory=list)
    conversation_id: str | None = None
    ttft_s: float | None = None
    decode_ms_per_token: float | None = None
    replica: str | None = None


class AssistantReply(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None


class Choice(ResponseModel):
    index: int = 0
    message: AssistantReply
    finish_reason: Literal["stop", "length"] = "stop"
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None
    medgemma: AnswerDetails | None = None


class Delta(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class StreamChoice(ResponseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[StreamChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    medgemma: AnswerDetails | None = None
