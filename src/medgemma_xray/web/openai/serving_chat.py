"""POST /v1/chat/completions: a typed request in, an answer (whole or streamed as server-sent events) out.

The order is the cost order: everything that needs no work (model, parameters, the conversation's shape, and
web.asking's rules on the whole conversation, as every door applies them) is checked before the film is decoded,
and the film before the answer is queued. Errors before the first
token are HTTP statuses (errors.py); after it, a stream carries the error as its last event, as OpenAI and vLLM do.
A client that goes away, streaming or not, stops its answer and frees its decode slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from medgemma_xray.inference_api.types import GenerationRequest, GenerationStats
from medgemma_xray.web.openai.answer_feed import AnswerFeed, Progress
from medgemma_xray.web.openai.errors import ApiError, bad_request, from_service
from medgemma_xray.web.openai.protocol import (
    AnswerDetails,
    AssistantReply,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    ChoiceLogprobs,
    Delta,
    PromptTokensDetails,
    StreamChoice,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from medgemma_xray.web.openai.stop_strings import StopStrings, TokenCursor

if TYPE_CHECKING:
    from anyio import CapacityLimiter
    from starlette.requests import Request

    from medgemma_xray.intake import IntakeFilm
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.asking import Asking
    from medgemma_xray.web.openai.conversation_ids import BoundConversation, ConversationIds
    from medgemma_xray.web.openai.films import FilmReader
    from medgemma_xray.web.openai.serving_models import OpenAIServingModels

logger = logging.getLogger(__name__)

FRAME_INTERVAL_S = 0.02  # a stream's frames: at most 50 a second (several tokens each at the H200's pace)


@dataclass
class Answer:
    """One running answer, as the serving class tracks it."""

    request: ChatCompletionRequest
    model: str
    stats: GenerationStats
    feed: AnswerFeed
    film: IntakeFilm
    conversation: BoundConversation | None
    received: float
    stops: StopStrings
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.cursor = TokenCursor(self.stats)


class OpenAIServingChat:
    def __init__(
        self,
        service: InferenceSurface,
        models: OpenAIServingModels,
        films: FilmReader,
        conversations: ConversationIds,
        asking: Asking,
    ) -> None:
        self.service, self.models, self.films = service, models, films
        self.conversations, self.asking = conversations, asking
        settings = service.settings
        self.max_new_tokens = settings.max_new_tokens
        # Each waiting or running answer holds one worker thread that reads it; more than the service can hold
        # wait here instead of starving the server's shared pool.
        self._reader_threads = settings.generation_concurrency + settings.queue_size + 4
        self._limiter: CapacityLimiter | None = None  # an anyio.CapacityLimiter, made on the event loop
        self._readers: set[asyncio.Task] = set()

    async def create_chat_completion(
        self, request: ChatCompletionRequest, raw_request: Request, user: str | None
    ) -> ChatCompletionResponse | AsyncIterator[bytes]:
        received = time.perf_counter()
        model = self.models.check(request.model)
        tokens = request.answer_tokens or self.max_new_tokens
        if tokens > self.max_new_tokens:
            raise bad_request(
                f"max_completion_tokens (or max_tokens) must be at most {self.max_new_tokens}, this server's "
                "MAX_NEW_TOKENS.",
                param="max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens",
            )
        import anyio

        from medgemma_xray.web.openai.conversation import conversation_of

        self.asking.admit(user or (raw_request.client.host if raw_request.client else None))
        conversation = conversation_of(request)
        extra = {} if conversation.system_prompt is None else {"system_prompt": conversation.system_prompt}
        generation = GenerationRequest(image=None, turns=conversation.turns, max_new_tokens=tokens, **extra)
        await anyio.to_thread.run_sync(self.asking.check, generation)  # it may count tokens: off the event loop
        self.asking.check_prior(conversation.prior_url is not None)  # before any film is read
        prior = await self.films.read(conversation.prior_url) if conversation.prior_url is not None else None
        film = await self.films.read(conversation.film_url)
        if prior is not None:  # the length check again, with both films' image tokens
            both = replace(generation, image=film.model_image, prior_image=prior.model_image)
            await anyio.to_thread.run_sync(self.asking.check, both)
        bound = self.conversations.bind(request.conversation_id, user)
        generation = replace(
            generation,
            image=film.model_image,
            image_key=film.image_key,
            prior_image=prior.model_image if prior is not None else None,
            prior_image_key=prior.image_key if prior is not None else None,
            conversation_id=bound.key if bound else None,
        )
        logger.info(
            "chat completion: stream=%s turns=%d max_tokens=%d", bool(request.stream), len(generation.turns), tokens
        )
        answer = await self._start(request, model, generation, film, bound, received)
        watcher = asyncio.get_running_loop().create_task(_until_disconnected(raw_request))
        try:  # a client that leaves while its answer waits in the queue frees its place too
            first = await _next_or_disconnect(answer.feed, watcher)
            if first.error is not None:
                raise from_service(first.error)
            if request.stream:
                return self._stream(answer, first)  # from here Starlette watches the connection
            return await self._complete(answer, first, watcher)
        finally:
            watcher.cancel()

    async def _start(self, request, model, generation, film, bound, received) -> Answer:
        import anyio

        ticket = self.asking.claim(generation.conversation_id)  # 409 while another answer of it runs
        stats = GenerationStats()
        feed = AnswerFeed(self.asking.stream(generation, ticket, stats), asyncio.get_running_loop())
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._reader_threads)

        async def read() -> None:
            try:
                await anyio.to_thread.run_sync(feed.read_all, limiter=self._limiter)
            finally:
                self.asking.release(ticket)  # only once the answer is closed: its KV is free for the next turn

        reader = asyncio.get_running_loop().create_task(read())
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        return Answer(request, model, stats, feed, film, bound, received, StopStrings(request.stop_strings))

    # --- a whole answer -------------------------------------------------------------------------------------------
    async def _complete(self, answer: Answer, progress: Progress, watcher: asyncio.Task) -> ChatCompletionResponse:
        try:
            while not progress.finished:
                if progress.text is not None and answer.stops.first_match(progress.text) is not None:
                    break
                progress = await _next_or_disconnect(answer.feed, watcher)
        finally:
            if not progress.finished:
                answer.feed.stop()  # a stop string, or the client left: the answer ends at its next token
        if progress.error is not None:
            raise from_service(progress.error)
        text, finish, tokens = self._final(answer, progress.text or "")
        choice = Choice(message=AssistantReply(content=text), finish_reason=finish)
        if answer.request.logprobs:
            choice.logprobs = ChoiceLogprobs(content=self._logprobs(answer, 0, tokens))
        return ChatCompletionResponse(
            id=answer.id,
            created=answer.created,
            model=answer.model,
            choices=[choice],
            usage=self._usage(answer, tokens),
            medgemma=self._details(answer, tokens),
        )

    # --- a stream -------------------------------------------------------------------------------------------------
    async def _stream(self, answer: Answer, progress: Progress) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        sent_chars = sent_tokens = 0
        try:
            opening = AnswerDetails(  # the id to continue with, before the answer ends
                conversation_id=answer.conversation.public_id if answer.conversation else None,
                warnings=list(answer.film.warnings),
            )
            yield self._frame(answer, Delta(role="assistant", content=""), details=opening)
            while True:
                text = progress.text or ""
                match = answer.stops.first_match(text)
                done = progress.finished or match is not None
                if progress.error is not None:
                    raise progress.error
                if done:
                    break
                visible = answer.stops.safe_length(text)
                tokens = answer.cursor.covered(visible)
                if visible > sent_chars or tokens > sent_tokens:
                    logprobs = self._logprobs(answer, sent_tokens, tokens) if answer.request.logprobs else None
                    yield self._frame(answer, Delta(content=text[sent_chars:visible]), logprobs=logprobs)
                    sent_chars, sent_tokens = visible, tokens
                progress = await answer.feed.next(hold_until=loop.time() + FRAME_INTERVAL_S)
            final_text, finish, tokens = self._final(answer, progress.text or "")
            logprobs = self._logprobs(answer, sent_tokens, tokens) if answer.request.logprobs else None
            if len(final_text) > sent_chars or logprobs:
                yield self._frame(answer, Delta(content=final_text[sent_chars:]), logprobs=logprobs)
            yield self._frame(answer, Delta(), finish=finish, details=self._details(answer, tokens))
            options = answer.request.stream_options
            if options is not None and options.include_usage:
                chunk = ChatCompletionChunk(
                    id=answer.id,
                    created=answer.created,
                    model=answer.model,
                    choices=[],
                    usage=self._usage(answer, tokens),
                )
                yield _event(chunk.model_dump_json(exclude_none=True))
        except Exception as exc:  # after the headers: the error goes in the stream, as vLLM and OpenAI do
            yield _event(from_service(exc).body_json())
        finally:
            answer.feed.stop()  # a closed connection ends the answer: its slot frees at the scheduler's next turn
        yield b"data: [DONE]\n\n"

    def _frame(self, answer: Answer, delta: Delta, *, finish=None, logprobs=None, details=None) -> bytes:
        choice = StreamChoice(delta=delta, finish_reason=finish, logprobs=None)
        if logprobs is not None:
            choice.logprobs = ChoiceLogprobs(content=logprobs)
        chunk = ChatCompletionChunk(id=answer.id, created=answer.created, model=answer.model, choices=[choice])
        if details is not None:
            chunk.medgemma = details
        return _event(chunk.model_dump_json(exclude_none=True))

    # --- the figures of an answer ---------------------------------------------------------------------------------
    def _final(self, answer: Answer, text: str) -> tuple[str, Literal["stop", "length"], int]:
        """The answer's text, its finish reason, and how many of its tokens it has (a stop string cuts both)."""
        match = answer.stops.first_match(text)
        if match is not None:
            end = match + answer.stops.matched_length(text, match)
            return text[:match], "stop", answer.cursor.covered(end, through=True)
        finish: Literal["stop", "length"] = "length" if answer.stats.finish_reason == "length" else "stop"
        return text, finish, answer.stats.new_tokens

    def _logprobs(self, answer: Answer, start: int, end: int) -> list[TokenLogprob]:
        stats, top = answer.stats, bool(answer.request.top_logprobs)
        entries = []
        for index in range(start, min(end, len(stats.token_texts), len(stats.token_logprobs))):
            text, logprob = stats.token_texts[index], float(stats.token_logprobs[index])
            encoded = list(text.encode("utf-8", "surrogatepass"))
            alternatives = [TopLogprob(token=text, logprob=logprob, bytes=encoded)] if top else []
            entries.append(TokenLogprob(token=text, logprob=logprob, bytes=encoded, top_logprobs=alternatives))
        return entries

    def _usage(self, answer: Answer, tokens: int) -> Usage:
        stats = answer.stats
        return Usage(
            prompt_tokens=stats.prompt_tokens,
            completion_tokens=tokens,
            total_tokens=stats.prompt_tokens + tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.reused_tokens),
        )

    def _details(self, answer: Answer, tokens: int) -> AnswerDetails:
        from medgemma_xray.assistant.confidence import answer_confidence

        stats = answer.stats
        confidence = answer_confidence(
            stats.token_ids[:tokens], stats.token_logprobs[:tokens], stats.token_texts[:tokens]
        )
        details = AnswerDetails(
            confidence=confidence.to_dict() if confidence else None,
            reused_tokens=stats.reused_tokens,
            warnings=list(answer.film.warnings),
            conversation_id=answer.conversation.public_id if answer.conversation else None,
            replica=stats.replica,
        )
        times = stats.token_times
        if times:  # this server's clock: from the request's arrival to the first token
            details.ttft_s = times[0] - answer.received
            details.decode_ms_per_token = (times[-1] - times[0]) / (len(times) - 1) * 1e3 if len(times) > 1 else None
        return details


def _event(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"


async def _until_disconnected(raw_request: Request) -> None:
    """Returns when the client has closed its connection (its body has been read already)."""
    while True:
        message = await raw_request.receive()
        if message["type"] == "http.disconnect":
            return


async def _next_or_disconnect(feed: AnswerFeed, watcher: asyncio.Task) -> Progress:
    """The feed's next progress; ApiError 499 (which nobody reads) when the client leaves first."""
    progress = asyncio.ensure_future(feed.next())
    await asyncio.wait({progress, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if progress.done():
        return progress.result()
    progress.cancel()
    feed.stop()  # the client left: the reading thread closes the answer at its next token
    raise ApiError(499, "The client closed the request before its answer.", code="client_closed_request")
