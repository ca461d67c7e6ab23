"""The token-level contract every backend implements, and the generation loop it owns once for all of them.

A backend implements the minimum (Polygraphy's runner shape: the public methods validate and keep the books, the
`_*_impl` methods do the work):
- encode a request into prompt token ids (its own tokenizer and chat template);
- allocate, truncate and free a conversation's KV state;
- prefill prompt tokens into that state, and decode one token for each of several sequences at once, returning
  token ids and their log-probabilities;
- image features; info; warm-up; close.

This class owns the rest: stop tokens, the token limit, detokenisation, stats, cancellation, and the cache of
resident conversations (a follow-up question prefills only its new tokens). A scheduler drives many generations
through start / prefill / step / finish; `stream_generate` is the same loop for one caller.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_bundle.defaults import DEFAULT_MAX_RESIDENT_CONVERSATIONS
from inference_api.decoding import IncrementalDecoder
from inference_api.errors import BackendClosedError, ConversationTooLongError, NoFreeSlotError, RequestError
from inference_api.types import (  # noqa: F401  (re-exported: the contract's vocabulary in one import)
    DEFAULT_MAX_NEW_TOKENS,
    MAX_MAX_NEW_TOKENS,
    SYSTEM_PROMPT,
    BackendInfo,
    ChatTurn,
    GenerationRequest,
    GenerationStats,
    Mode,
    TokenStep,
)

logger = logging.getLogger(__name__)


@dataclass
class Prompt:
    """A request encoded by its backend: token ids, plus the film for the image tokens among them."""

    ids: list[int]
    image: Any
    image_key: str | None
    features: Any = None  # the backend's image embedding, computed once (see prepare_images)
    extras: dict = field(default_factory=dict)  # backend-specific inputs (e.g. the processor's pixel values)


class Conversation:
    """KV state of one conversation on a backend: exactly the tokens in `ids` have been fed to the model."""

    def __init__(self, conversation_id: str | None, image_key: str | None, kv: Any) -> None:
        self.conversation_id = conversation_id
        self.image_key = image_key
        self.kv = kv
        self.ids: list[int] = []
        self.in_use = False
        self.forgotten = False  # "new case" while an answer was running: free it when that answer ends


class Generation:
    """One answer in progress. After each prefill/step call: `new_text`, `last_step` and `done` say what happened."""

    def __init__(self, request: GenerationRequest, prompt: Prompt, conversation: Conversation, stats) -> None:
        self.request = request
        self.prompt = prompt
        self.conversation = conversation
        self.stats: GenerationStats = stats
        self.prefilled = len(conversation.ids)  # prompt tokens whose KV is in place
        self.pending: int | None = None  # sampled but not fed yet
        self.last_step: TokenStep | None = None
        self.new_text = ""
        self.done = False
        self.started = time.perf_counter()
        self.decoder: IncrementalDecoder | None = None

    @property
    def prefill_done(self) -> bool:
        return self.pending is not None or self.done


class InferenceBackend(abc.ABC):
    """A loaded model that answers questions about a film through the token-level contract.

    The public generation methods serialise on one lock, so direct callers may share a backend between threads;
    the serving layer drives each backend from one scheduler thread.
    """

    #: How many generations one `step` call may decode together (a static-cache backend's slots).
    max_batch: int = 1
    #: Longest prefill chunk; None: the whole prompt at once. Chunks never split an image's tokens.
    prefill_chunk_tokens: int | None = None

    def __init__(self, max_resident_conversations: int = DEFAULT_MAX_RESIDENT_CONVERSATIONS) -> None:
        self._closed = False
        self._close_lock = threading.Lock()
        self._lock = threading.RLock()
        self._resident: OrderedDict[str, Conversation] = OrderedDict()
        self.max_resident_conversations = max(0, int(max_resident_conversations))
        # False while a backend stands by after a hot switch: it keeps no conversation's KV memory.
        self.keep_conversations = True
        self.stop_token_ids: frozenset[int] = frozenset()
        self.image_token_id: int | None = None
        self.max_sequence: int | None = None  # longest conversation plus answer, where the backend has a limit

    # --- one caller: the whole loop --------------------------------------------------------------------------
    def stream_generate(self, request: GenerationRequest, stats: GenerationStats | None = None) -> Iterator[str]:
        """Yield the answer as text fragments, in order; their concatenation is the whole answer.

        Closing the iterator early cancels the answer. `stats`, if given, is filled in as tokens arrive.
        """
        generation = self.start(request, stats)
        try:
            self.prepare_images([generation])
            while not self.prefill(generation):
                pass
            while True:
                if generation.new_text:
                    yield generation.new_text
                if generation.done:
                    return
                self.step([generation])
        finally:
            self.finish(generation, cancelled=not generation.done)

    def generate(self, request: GenerationRequest, stats: GenerationStats | None = None) -> str:
        return "".join(self.stream_generate(request, stats))

    def generate_steps(self, request: GenerationRequest) -> list[TokenStep]:
        """The generated tokens with their log-probabilities (stop token excluded): what verification compares."""
        stats = GenerationStats()
        for _ in self.stream_generate(request, stats):
            pass
        return [TokenStep(t, p) for t, p in zip(stats.token_ids, stats.token_logprobs, strict=True)]

    def next_token_logits(self, request: GenerationRequest):
        """float32 logits (numpy, vocab-sized) of the first answer token: what a precision check compares as a
        whole distribution (KL), beyond the greedy token."""
        self.check_health()
        request.validate()
        with self._lock:
            prompt = self._encode_impl(request)
            kv = self._allocate()
            try:
                if self.image_token_id is not None and self.image_token_id in prompt.ids:
                    self._prepare_images_impl([prompt])
                return self._prompt_logits_impl(kv, prompt)
            finally:
                self._free_impl(kv)

    # --- many callers: what a scheduler drives ---------------------------------------------------------------------
    def start(self, request: GenerationRequest, stats: GenerationStats | None = None) -> Generation:
        """Encode the request and place it on a conversation (a resident one when it can be reused). No model work."""
        self.check_health()
        request.validate()
        stats = stats if stats is not None else GenerationStats()
        with self._lock:
            prompt = self._encode_impl(request)
            if not prompt.ids:
                raise RequestError("the prompt encoded to no tokens")
            stats.prompt_tokens = len(prompt.ids)
            if self.max_sequence is not None and len(prompt.ids) + request.max_new_tokens > self.max_sequence:
                raise ConversationTooLongError(
                    f"the conversation ({len(prompt.ids)} tokens) plus the answer ({request.max_new_tokens}) exceeds "
                    f"this model's maximum of {self.max_sequence} tokens; start a new case to continue"
                )
            if prompt.image_key is None and request.conversation_id is not None and prompt.image is not None:
                prompt.image_key = request.image_key or _image_fingerprint(prompt.image)
            conversation = self._conversation_for(request.conversation_id, prompt)
            generation = Generation(request, prompt, conversation, stats)
            stats.reused_tokens = generation.prefilled
            generation.decoder = IncrementalDecoder(self._detokenize_impl)
            return generation

    def prepare_images(self, generations: Sequence[Generation]) -> None:
        """Encode the films of the generations that still need them, as one vision batch."""
        with self._lock:
            waiting = [g for g in generations if g.prompt.features is None and self._needs_image(g)]
            if waiting:
                self._prepare_images_impl([g.prompt for g in waiting])

    def prefill(self, generation: Generation, budget_tokens: int | None = None) -> bool:
        """Feed the next chunk of the prompt (at most budget_tokens). True once the first answer token is sampled."""
        self.check_health()
        if generation.prefill_done:
            return True
        with self._lock:
            if self._needs_image(generation) and generation.prompt.features is None:
                self._prepare_images_impl([generation.prompt])
            start = generation.prefilled
            end = self._chunk_end(generation.prompt, start, budget_tokens)
            last = end == len(generation.prompt.ids)
            step = self._prefill_impl(generation.conversation.kv, generation.prompt, start, end, last)
            generation.conversation.ids.extend(generation.prompt.ids[start:end])
            generation.prefilled = end
            if last:
                self._accept(generation, step)
            return last

    def step(self, generations: Sequence[Generation]) -> None:
        """Decode one token for each generation (one batched call where the backend can)."""
        self.check_health()
        active = [g for g in generations if not g.done and g.pending is not None]
        if not active:
            return
        with self._lock:
            for index in range(0, len(active), max(1, self.max_batch)):
                chunk = active[index : index + self.max_batch]
                kvs = [g.conversation.kv for g in chunk]
                tokens = [g.pending for g in chunk]
                positions = [len(g.conversation.ids) for g in chunk]
                steps = self._decode_impl(kvs, tokens, positions)
                for generation, token, step in zip(chunk, tokens, steps, strict=True):
                    generation.conversation.ids.append(token)
                    self._accept(generation, step)

    def finish(self, generation: Generation, cancelled: bool = False) -> None:
        """End a generation: keep its conversation resident for the next turn, or free it. Idempotent."""
        conversation = generation.conversation
        if not generation.done:
            generation.done = True
            generation.stats.finish_reason = "cancelled" if cancelled else generation.stats.finish_reason
        if generation.stats.total_s is None:
            generation.stats.total_s = time.perf_counter() - generation.started
        with self._lock:
            if not conversation.in_use:
                return
            conversation.in_use = False
            keep = (
                conversation.conversation_id is not None
                and not conversation.forgotten
                and self.max_resident_conversations > 0
                and self.keep_conversations
                and not self._closed
            )
            if keep:
                self._resident[conversation.conversation_id] = conversation
                self._resident.move_to_end(conversation.conversation_id)
                self._evict_until(self.max_resident_conversations)
            else:
                self._free(conversation)

    def forget(self, conversation_id: str) -> None:
        """Free a conversation's KV state ("new case", a closed session). A running answer frees it when it ends."""
        with self._lock:
            conversation = self._resident.pop(conversation_id, None)
            if conversation is not None:
                self._free(conversation)

    def forget_all(self) -> None:
        with self._lock:
            while self._resident:
                self._free(self._resident.popitem(last=False)[1])

    @property
    def resident_conversations(self) -> list[str]:
        with self._lock:
            return list(self._resident)

    # --- the rest of the contract ----------------------------------------------------------------------------------
    def image_features(self, images: Sequence[Any]):
        """Projected image embeddings, float32 numpy of shape (len(images), 256, text hidden size)."""
        self.check_health()
        if not images:
            raise RequestError("image_features needs at least one image")
        with self._lock:
            return self._image_features_impl(list(images))

    def info(self) -> BackendInfo:
        return self._info_impl()

    def warm_up(self) -> float:
        """Run a short request so the first user does not pay for lazy initialisation. Returns seconds taken."""
        self.check_health()
        started = time.perf_counter()
        self._warm_up_impl()
        elapsed = time.perf_counter() - started
        logger.info("%s backend warmed up in %.2f s", self.info().mode_label, elapsed)
        return elapsed

    def check_health(self) -> None:
        if self._closed:
            raise BackendClosedError(f"{type(self).__name__} is closed")

    def close(self) -> None:
        """Release the model and every conversation's state. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with self._lock:
            self.forget_all()
            self._close_impl()
        logger.info("%s backend closed", type(self).__name__)

    @property
    def closed(self) -> bool:
        return self._closed

    # A backend is a context manager, as Polygraphy's runners are: `with create_backend(...) as backend:` closes it
    # on every way out, so callers need no try/finally around close().
    def __enter__(self) -> InferenceBackend:
        self.check_health()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- bookkeeping ---------------------------------------------------------------------------------------------
    def _accept(self, generation: Generation, step: TokenStep) -> None:
        stats = generation.stats
        generation.last_step, generation.new_text, generation.pending = step, "", None
        if step.token_id in self.stop_token_ids:
            generation.done, stats.finish_reason = True, "stop"
            generation.new_text = generation.decoder.flush()
            return
        if stats.first_token_s is None:
            stats.first_token_s = time.perf_counter() - generation.started
        stats.new_tokens += 1
        text = generation.decoder.push(step.token_id)
        stats.token_ids.append(step.token_id)
        stats.token_logprobs.append(step.logprob)
        stats.token_texts.append(text)
        stats.token_times.append(time.perf_counter())
        generation.new_text = text
        if stats.new_tokens >= generation.request.max_new_tokens:
            generation.done, stats.finish_reason = True, "length"
            generation.new_text += generation.decoder.flush()
        else:
            generation.pending = step.token_id

    def _conversation_for(self, conversation_id: str | None, prompt: Prompt) -> Conversation:
        resident = self._resident.pop(conversation_id, None) if conversation_id is not None else None
        if resident is not None:
            reuse = self._reusable_prefix(resident, prompt)
            if reuse > 0 and (reuse == len(resident.ids) or self._truncate_impl(resident.kv, reuse)):
                del resident.ids[reuse:]
                resident.in_use = True
                return resident
            self._free(resident)
        conversation = Conversation(conversation_id, prompt.image_key, self._allocate())
        conversation.in_use = True
        return conversation

    def _reusable_prefix(self, conversation: Conversation, prompt: Prompt) -> int:
        """Tokens of the cached conversation the new prompt starts with; never all of them (logits are needed)."""
        if conversation.image_key != prompt.image_key:
            return 0
        limit = min(len(conversation.ids), len(prompt.ids) - 1)
        common = 0
        while common < limit and conversation.ids[common] == prompt.ids[common]:
            common += 1
        # An image's tokens attend to each other both ways: never resume inside an image, go back to its start.
        image = self.image_token_id
        if image is not None and common < len(prompt.ids) and prompt.ids[common] == image:
            while common > 0 and prompt.ids[common - 1] == image:
                common -= 1
        return common

    def _allocate(self):
        while True:
            try:
                return self._allocate_impl()
            except NoFreeSlotError:
                if not self._resident:
                    raise
                self._free(self._resident.popitem(last=False)[1])  # the least recently used idle conversation

    def _evict_until(self, limit: int) -> None:
        while len(self._resident) > limit:
            self._free(self._resident.popitem(last=False)[1])

    def _free(self, conversation: Conversation) -> None:
        if conversation.kv is not None:
            kv, conversation.kv = conversation.kv, None
            self._free_impl(kv)

    def _needs_image(self, generation: Generation) -> bool:
        prompt = generation.prompt
        return self.image_token_id is not None and self.image_token_id in prompt.ids[generation.prefilled :]

    def _chunk_end(self, prompt: Prompt, start: int, budget: int | None) -> int:
        limits = [limit for limit in (budget, self.prefill_chunk_tokens) if limit]
        total = len(prompt.ids)
        if not limits or total - start <= min(limits):
            return total
        end = start + min(limits)
        image = self.image_token_id
        if image is not None and prompt.ids[end - 1] == image and prompt.ids[end] == image:
            # The cut falls inside an image: move it before the image if the chunk holds something else, else past it.
            run_start = end - 1
            while run_start > start and prompt.ids[run_start - 1] == image:
                run_start -= 1
            if run_start > start:
                return run_start
            while end < total and prompt.ids[end] == image:
                end += 1
        return end

    # --- what each backend implements ------------------------------------------------------------------------------
    @abc.abstractmethod
    def _encode_impl(self, request: GenerationRequest) -> Prompt:
        """Token ids of the whole prompt, rendered with the model's chat template."""

    @abc.abstractmethod
    def _allocate_impl(self) -> Any:
        """A fresh, empty KV state for one conversation. Raise NoFreeSlotError when none is free."""

    @abc.abstractmethod
    def _prefill_impl(self, kv: Any, prompt: Prompt, start: int, end: int, want_token: bool) -> TokenStep | None:
        """Feed prompt.ids[start:end] at positions start..end-1; return the greedy next token if want_token."""

    @abc.abstractmethod
    def _decode_impl(self, kvs: list, tokens: list[int], positions: list[int]) -> list[TokenStep]:
        """Feed tokens[i] at positions[i] into kvs[i]; return each sequence's greedy next token."""

    @abc.abstractmethod
    def _prompt_logits_impl(self, kv: Any, prompt: Prompt):
        """Prefill the whole prompt into an empty kv; return the next token's float32 logits as a numpy array."""

    def _truncate_impl(self, kv: Any, length: int) -> bool:
        """Keep only the first `length` positions. False where the backend cannot (the contract then re-prefills)."""
        return False

    @abc.abstractmethod
    def _free_impl(self, kv: Any) -> None: ...

    def _prepare_images_impl(self, prompts: list[Prompt]) -> None:
        """Compute prompt.features for each prompt, ideally as one batch. A backend that encodes the film inside
        its prefill may leave this as it is."""
        return None

    @abc.abstractmethod
    def _detokenize_impl(self, ids: list[int]) -> str: ...

    @abc.abstractmethod
    def _image_features_impl(self, images: list[Any]): ...

    @abc.abstractmethod
    def _info_impl(self) -> BackendInfo: ...

    def _warm_up_impl(self) -> None:
        from PIL import Image

        request = GenerationRequest(Image.new("RGB", (896, 896)), (ChatTurn("user", "Warm-up."),), max_new_tokens=2)
        for _ in self.stream_generate(request):
            pass

    @abc.abstractmethod
    def _close_impl(self) -> None: ...


def _image_fingerprint(image) -> str:
    """A content hash of the film (crc32 of its pixels: ~1 ms for 896x896 RGB), so a cache is never reused across films."""
    data = image.tobytes() if hasattr(image, "tobytes") else bytes(image)
    return f"{zlib.crc32(data):08x}-{len(data)}"
