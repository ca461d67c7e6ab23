"""One way to ask, for every door (main page, /teaching, the OpenAI API, the Ray ingress): the rules a conversation
must keep, one answer at a time per conversation, Stop, optional throttling, and one error family with two small
adapters (to gr.Error, and to OpenAI's error body).

The rules hold for the whole conversation a door sends, every turn of it, before any work is done:
- at most MAX_TURNS questions;
- each question (and a system message) at most MAX_PROMPT_TOKENS, bounded by its UTF-8 bytes (a token of Gemma's
  tokenizer covers at least one byte); each assistant turn at most ANSWER_BYTES_PER_TOKEN bytes a token of
  MAX_NEW_TOKENS (a client may send history the server never wrote);
- no turn carries a control marker of the model's chat format (<start_of_turn>, <end_of_turn>, ...) or an image
  marker (<image_soft_token>, <start_of_image>, ...): Gemma's tokenizer turns them into control tokens even inside
  user text, so a question could fake a model turn or add image slots, and a prompt with more image tokens than
  images cannot be prefilled;
- a prior film (a "what changed?" comparison) only where the serving checkpoint compares films
  (BackendInfo.capabilities holds "longitudinal"), never faked on one that does not;
- the prompt's tokens plus the answer's fit MAX_SEQUENCE: counted by the serving model's own tokenizer
  (InferenceSurface.count_prompt_tokens) when the byte bound alone cannot show that they fit.

Stop is keyed by a token the server makes for each answer and keeps in the session's server-side state (or, for
an API client, nowhere: closing the connection stops its answer). A client cannot name another's answer.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from medgemma_xray.inference_api.errors import RequestError

if TYPE_CHECKING:
    from medgemma_xray.inference_api.types import GenerationRequest, GenerationStats
    from medgemma_xray.serving.surface import InferenceSurface

logger = logging.getLogger(__name__)

# Every special token a Gemma 3 tokenizer matches inside text: chat turns, images, audio, and the reserved ones.
CONTROL_MARKERS = re.compile(
    r"<(?:start_of_turn|end_of_turn|start_of_image|end_of_image|image_soft_token|start_of_audio|end_of_audio"
    r"|audio_soft_token|bos|eos|pad|unk|mask|unused\d+)>|\[@BOS@\]"
)
ANSWER_BYTES_PER_TOKEN = 16  # the longest pieces of Gemma's vocabulary are runs of spaces or punctuation
TEMPLATE_TOKENS_PER_TURN = 8  # <start_of_turn>role\n ... <end_of_turn>\n
IMAGE_AND_SYSTEM_TOKENS = 300  # <start_of_image>, 256 image tokens, <end_of_image>, the line breaks around them
WAIT_MESSAGE = "An answer in this conversation is still running. Wait for it to finish (or press Stop), then ask again."


# --- the error family ---------------------------------------------------------------------------------------------
class AskRefused(RequestError):
    """A question the server will not answer as sent; the message says what to change. code and http_status are
    stable for API clients; param names the request field at fault."""

    code: ClassVar[str] = "invalid_request"
    http_status: ClassVar[int] = 400
    param: str | None = "messages"
    retry_after_s: int | None = None


class QuestionRefused(AskRefused):
    """A turn is empty, too long, or carries a control marker."""

    code = "invalid_question"


class ConversationTooLong(AskRefused):
    """Too many questions, or a prompt that with its answer would not fit the model's sequence."""

    code = "conversation_too_long"


class PriorUnsupported(AskRefused):
    """A prior film was sent to a checkpoint that does not compare films (inference_api/capabilities)."""

    code = "prior_film_unsupported"


class AnswerRunning(AskRefused):
    """Another answer in this conversation is still running."""

    code = "conversation_busy"
    http_status = 409
    param = "conversation_id"


class Throttled(AskRefused):
    """The client asked more often than QUESTIONS_PER_MINUTE allows."""

    code = "rate_limit_exceeded"
    http_status = 429
    param = None

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def log_refusal(exc: BaseException, where: str = "") -> None:
    """The class only, never the message (it can quote the client's text) or a traceback."""
    cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
    logger.warning("%suser error: %s", f"{where}: " if where else "", type(cause).__name__)


def to_gradio(exc: BaseException):
    """A refusal as the pages show it: a toast with the message, no traceback in the console. The main page and
    /teaching raise what this returns."""
    import gradio as gr

    return gr.Error(str(exc), duration=None, print_exception=False)


def to_openai(exc: AskRefused) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(HTTP status, OpenAI's error body, headers) for a refusal."""
    kind = "rate_limit_error" if exc.http_status == 429 else "invalid_request_error"
    body = {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.code}}
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else {}
    return exc.http_status, body, headers


# --- the rules ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AskLimits:
    max_turns: int = 20
    max_prompt_tokens: int = 2048  # one question, and a system message
    max_new_tokens: int = 300  # the server's longest answer (its assistant turns are at most this long)
    max_sequence: int = 4096  # prompt plus answer
    questions_per_minute: int = 0  # per client; 0: no throttling

    @classmethod
    def from_settings(cls, settings: Any) -> AskLimits:
        return cls(
            max_turns=settings.max_turns,
            max_prompt_tokens=settings.max_prompt_tokens,
            max_new_tokens=settings.max_new_tokens,
            max_sequence=settings.max_sequence,
            questions_per_minute=int(getattr(settings, "questions_per_minute", 0)),
        )

    @property
    def max_answer_bytes(self) -> int:
        return ANSWER_BYTES_PER_TOKEN * self.max_new_tokens


def client_key(request: Any) -> str | None:
    """Whom throttling counts for a page's request (a gr.Request): its login name, else its address."""
    if request is None:
        return None
    client = getattr(request, "client", None)
    return getattr(request, "username", None) or (getattr(client, "host", None) if client is not None else None)


def find_marker(text: str) -> str | None:
    found = CONTROL_MARKERS.search(text)
    return found.group(0) if found else None


# --- one answer at a time per conversation, and Stop -------------------------------------------------------------
@dataclass
class AnswerTicket:
    """One running answer. stop_token is the server's own; `stopped` is set by Stop (or because the conversation
    ended); `superseded` also when the film, the case or the conversation changed, after which the answer's door
    writes nothing more into its session."""

    conversation_id: str
    stop_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    stopped: threading.Event = field(default_factory=threading.Event)
    superseded: bool = False
    finished: threading.Event = field(default_factory=threading.Event)  # set when the answer's door released it


class Asking:
    """The one object a door asks through. Thread-safe; one per server (Asking.for_service)."""

    def __init__(self, service: InferenceSurface, limits: AskLimits | None = None) -> None:
        self.service = service
        self.limits = limits or AskLimits.from_settings(service.settings)
        self._lock = threading.Lock()
        self._by_conversation: dict[str, AnswerTicket] = {}
        self._by_token: dict[str, AnswerTicket] = {}
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)

    @classmethod
    def for_service(cls, service: InferenceSurface) -> Asking:
        """The service's one Asking, made on first use and kept on it: the pages and the API share its locks."""
        with _SHARED_LOCK:
            asking = _SHARED.get(service)
            if asking is None:
                asking = _SHARED[service] = cls(service)
            return asking

    # --- the rules on a whole conversation --------------------------------------------------------------------------
    def check(self, request: GenerationRequest) -> None:
        """Every rule on the conversation, before any work. Raises QuestionRefused or ConversationTooLong."""
        check_turns(request, self.limits)
        self.check_prior(request.prior_image is not None)
        self._check_length(request)

    def check_template(self, request: GenerationRequest, typed: str) -> None:
        """A door's own prompt around a few words the user typed (the localisation prompt around a finding's
        name): the typed words keep every rule of a question; the whole prompt, which the server wrote and may be
        longer than MAX_PROMPT_TOKENS allows one question, must fit the sequence with its answer."""
        from dataclasses import replace

        from medgemma_xray.inference_api.types import ChatTurn

        check_turns(replace(request, turns=(ChatTurn("user", typed),)), self.limits)
        self._check_length(request)

    def check_prior(self, has_prior: bool) -> None:
        """A prior film only where the serving checkpoint compares films (a door may call this before it reads
        any film). Raises PriorUnsupported."""
        from medgemma_xray.inference_api.capabilities import has_capability, missing_capability_message
        from medgemma_xray.inference_api.types import LONGITUDINAL

        if not has_prior:
            return
        info = self.service.info()
        if not has_capability(info, LONGITUDINAL):
            raise PriorUnsupported(missing_capability_message(info, LONGITUDINAL))

    def _check_length(self, request: GenerationRequest) -> None:
        limits = self.limits
        budget = limits.max_sequence - request.max_new_tokens
        text_bytes = sum(len(turn.text.encode("utf-8", "surrogatepass")) for turn in request.turns)
        text_bytes += len((request.system_prompt or "").encode("utf-8", "surrogatepass"))
        overhead = IMAGE_AND_SYSTEM_TOKENS + TEMPLATE_TOKENS_PER_TURN * (len(request.turns) + 1)
        overhead += IMAGE_AND_SYSTEM_TOKENS if request.prior_image is not None else 0
        if text_bytes + overhead <= budget:  # every token covers at least one byte: it fits
            return
        if text_bytes > ANSWER_BYTES_PER_TOKEN * limits.max_sequence:
            tokens = None  # far too long for any tokenisation: refused without counting
        else:
            tokens = self.service.count_prompt_tokens(request)
            if tokens <= budget:
                return
        counted = f" is {tokens} tokens long and" if tokens is not None else ""
        raise ConversationTooLong(
            f"This conversation{counted} with an answer of {request.max_new_tokens} tokens does not fit the "
            f"model's limit of {limits.max_sequence} tokens. Press New case to start again on the same film (an API "
            "client starts a new conversation or sends fewer turns)."
        )

    def admit(self, client: str | None) -> None:
        """Throttling: a token bucket of QUESTIONS_PER_MINUTE per client (login name, else address); off at 0."""
        rate = self.limits.questions_per_minute
        if rate <= 0 or not client:
            return
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(client, (float(rate), now))
            tokens = min(float(rate), tokens + (now - at) * rate / 60.0)
            if tokens < 1.0:
                self._buckets[client] = (tokens, now)
                wait = int((1.0 - tokens) * 60.0 / rate) + 1
                raise Throttled(
                    f"Too many questions: at most {rate} a minute are answered for one user. Ask again in {wait} s.",
                    wait,
                )
            self._buckets[client] = (tokens - 1.0, now)
            if len(self._buckets) > 100_000:  # forget full buckets: they are the default
                self._buckets = {k: v for k, v in self._buckets.items() if v[0] < rate}

    # --- one answer at a time ---------------------------------------------------------------------------------------
    def claim(self, conversation_id: str | None) -> AnswerTicket:
        """Start an answer in this conversation; raises AnswerRunning while another runs. release() it."""
        ticket = AnswerTicket(conversation_id or f"anonymous-{secrets.token_hex(8)}")
        with self._lock:
            if conversation_id is not None and conversation_id in self._by_conversation:
                raise AnswerRunning(WAIT_MESSAGE)
            if conversation_id is not None:
                self._by_conversation[conversation_id] = ticket
            self._by_token[ticket.stop_token] = ticket
        return ticket

    def release(self, ticket: AnswerTicket) -> None:
        with self._lock:
            if self._by_conversation.get(ticket.conversation_id) is ticket:
                del self._by_conversation[ticket.conversation_id]
            self._by_token.pop(ticket.stop_token, None)
        ticket.finished.set()

    @contextlib.contextmanager
    def answering(self, conversation_id: str | None) -> Iterator[AnswerTicket]:
        """Held while one answer runs; released however it ends (finished, failed, stopped, or its client gone)."""
        ticket = self.claim(conversation_id)
        try:
            yield ticket
        finally:
            self.release(ticket)

    def is_answering(self, conversation_id: str) -> bool:
        with self._lock:
            return conversation_id in self._by_conversation

    def stop(self, stop_token: str | None) -> bool:
        """Stop: the answer holding this token ends at its next piece of text. False when none runs."""
        if not stop_token:
            return False
        with self._lock:
            ticket = self._by_token.get(stop_token)
        if ticket is None:
            return False
        ticket.stopped.set()
        return True

    def end_conversation(self, conversation_id: str, wait_s: float = 0.0) -> bool:
        """The film, the case or the conversation changed (×, a new upload, New case, a cleared chat, a closed tab):
        its running answer stops, and its door writes nothing more into the session. False when none runs.

        wait_s: wait (at most this long) until the answer's door has released it. A page's stream may have handed
        Gradio one last update before it saw the stop; once the stream has ended, that update is already on its
        way to the browser, so the page's own reply (an empty chat) arrives after it, not before."""
        with self._lock:
            ticket = self._by_conversation.get(conversation_id)
        if ticket is None:
            return False
        ticket.superseded = True
        ticket.stopped.set()
        if wait_s > 0 and not ticket.finished.wait(wait_s):
            logger.warning("an ended conversation's answer did not stop within %.0f s", wait_s)
        return True

    def running(self) -> int:
        """Answers running now (tests and memory bounds: an ended answer leaves nothing behind)."""
        with self._lock:
            return len(self._by_token)

    # --- the stream -------------------------------------------------------------------------------------------------
    def stream(
        self, request: GenerationRequest, ticket: AnswerTicket, stats: GenerationStats | None = None
    ) -> Iterator[str]:
        """The service's answer (cumulative text) until it ends or the ticket is stopped. Closing the service's
        stream, here or when the caller closes this one (a closed tab), frees the answer's decode slot."""
        answer = self.service.stream_answer(request, stats)
        try:
            for text in answer:
                if ticket.stopped.is_set():
                    return
                yield text
        finally:
            answer.close()


def check_turns(request: GenerationRequest, limits: AskLimits) -> None:
    """The rules that need no tokenizer: alternation, the turn limit, each turn's size and markers. (The batch CLI
    checks its questions file with these before it loads a model.)"""
    turns = request.turns
    try:
        request.validate()
    except AskRefused:
        raise
    except RequestError as exc:
        raise QuestionRefused(str(exc)) from None
    questions = sum(turn.role == "user" for turn in turns)
    if questions > limits.max_turns:
        raise ConversationTooLong(
            f"This conversation has reached its limit of {limits.max_turns} questions. Press New case and upload "
            "the film again to go on (an API client starts a new conversation)."
        )
    system = request.system_prompt or ""
    if len(system.encode("utf-8", "surrogatepass")) > limits.max_prompt_tokens:
        raise QuestionRefused(
            f"The system message is too long: at most {limits.max_prompt_tokens} tokens (about as many "
            "characters) are accepted. Shorten it and send the request again."
        )
    _refuse_marker(system, "The system message")
    last = len(turns) - 1
    for index, turn in enumerate(turns):
        size = len(turn.text.encode("utf-8", "surrogatepass"))
        if turn.role == "user" and size > limits.max_prompt_tokens:
            which = "The question" if index == last else f"Question {index // 2 + 1} of the conversation"
            raise QuestionRefused(
                f"{which} is too long: at most {limits.max_prompt_tokens} tokens (about as many characters) are "
                "accepted. Shorten it and ask again."
            )
        if turn.role == "assistant" and size > limits.max_answer_bytes:
            raise QuestionRefused(
                f"Answer {index // 2 + 1} of the conversation is longer than any answer this server writes "
                f"({limits.max_new_tokens} tokens). Send the conversation as the server answered it."
            )
        which = "The question" if index == last else f"Turn {index + 1} of the conversation ({turn.role})"
        _refuse_marker(turn.text, which)


def _refuse_marker(text: str, which: str) -> None:
    marker = find_marker(text)
    if marker is not None:
        raise QuestionRefused(
            f"{which} contains {marker}, a control marker of the model's chat format; remove it and ask again."
        )


_SHARED: weakref.WeakKeyDictionary[Any, Asking] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()
