"""The token-level contract every backend implements, and the generation loop it owns once for all of them.

A backend implements the minimum (Polygraphy's runner shape: the public methods validate and keep the books, the
`_*_impl` methods do the work):
- encode a request into prompt token ids (its own tokenizer and chat template);
- allocate, truncate and free a conversation's KV state;
- prefill prompt tokens into that state, and decode one token for each of several sequences at once, returning
  token ids and their log-probabilities;
- image features; info; warm-up; close.

This class owns the rest: stop tokens, the token limit, detokenisation, stats, cancellation, the cache of
resident conversations (a follow-up question prefills only its new tokens), and the caches shared across users
(inference_api/shared_caches.py): the vision tower's output keyed by the film's content hash, and, where the
backend has one, the KV of common prompt prefixes: shared by reference on a paged backend (its pages), copied into
a new conversation at admission on one with a block pool. A scheduler drives many generations through
start / launch_prefill / launch_step / complete / finish (on a backend that `overlaps`, launches return before the
device is done and complete() reads them later); `stream_generate` is the same loop for one caller.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from medgemma_xray.engine_bundle.defaults import DEFAULT_MAX_RESIDENT_CONVERSATIONS
from medgemma_xray.inference_api.decoding import IncrementalDecoder
from medgemma_xray.inference_api.errors import (
    BackendClosedError,
    ConversationTooLongError,
    NoFreeSlotError,
    RequestError,
)
from medgemma_xray.inference_api.shared_caches import (
    TEXT_ONLY_ROOT,
    ImageFeatureCache,
    PrefixBlockCache,
    image_content_hash,
)
from medgemma_xray.inference_api.types import (  # noqa: F401  (re-exported: the contract's vocabulary in one import)
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

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_IMAGE_CACHE_GIB = 0.5  # about 380 films of MedGemma-4B features (256 x 2560 bf16)


@dataclass
class Prompt:
    """A request encoded by its backend: token ids, plus the film (and the prior film, when the request compares
    two) for the image tokens among them.

    features: the image embeddings of every film the prompt holds, in prompt order (the prior's rows first), so
    the i-th image token of the prompt takes row i (shape (films, tokens, hidden) or (films * tokens, hidden))."""

    ids: list[int]
    image: Any
    image_key: str | None  # the film's content hash once start() has seen it (a caller's key is only a hint)
    features: Any = None  # the backend's image embedding, computed once (see prepare_images)
    extras: dict[str, Any] = field(default_factory=dict)  # backend-specific inputs (e.g. the processor's pixel values)
    prior: Any = None  # the earlier film, whose image tokens come before the current film's
    prior_key: str | None = None  # its content hash once start() has seen it

    @property
    def films(self) -> list[tuple[Any, str | None]]:
        """(film, content hash) of every film the prompt holds, in the order its image tokens come."""
        films = [(self.prior, self.prior_key)] if self.prior is not None else []
        return films + ([(self.image, self.image_key)] if self.image is not None else [])

    @property
    def images(self) -> list[Any]:
        """The films in prompt order (what a backend that reads pixels in its prefill passes to the processor)."""
        return [film for film, _ in self.films]

    @property
    def films_key(self) -> str | None:
        """What identifies all of the prompt's films together: the film's hash, or with a prior "prior>current".
        A resident conversation and a cached prefix are reused only under the same key: never for the same
        current film with another prior (or none), whose image tokens have the same ids but other features."""
        if self.prior is None:
            return self.image_key
        if self.prior_key is None or self.image_key is None:
            return None
        return f"{self.prior_key}>{self.image_key}"


@dataclass
class LastTurn:
    """What a resident conversation's last answer was, so its follow-up can continue from the generated ids.

    A previous answer's text re-tokenises to other ids than the model generated (a different split, the template
    trimming its spaces), so a follow-up encoded from text alone matches the resident KV only up to that answer.
    `skeleton` is the last prompt encoded with every assistant turn's text left empty: the next request's skeleton
    must start with it (same system prompt and questions), and what follows it is the new question's tokens."""

    skeleton: list[int]
    prompt_ids: list[int]  # the last prompt exactly as fed (earlier answers already as their generated ids)
    answers: tuple[str, ...]  # the assistant texts that prompt was given
    answer_ids: list[int]  # the ids generated for the last answer (stop token excluded)
    answer_text: str | None = None  # their decoding, computed at the first follow-up


class Conversation:
    """KV state of one conversation on a backend: exactly the tokens in `ids` have been fed to the model."""

    def __init__(self, conversation_id: str | None, image_key: str | None, kv: Any) -> None:
        self.conversation_id = conversation_id
        self.image_key = image_key  # the prompt's films_key: the film's hash, or "prior>current" for two films
        self.kv = kv
        self.ids: list[int] = []
        self.in_use = False
        self.forgotten = False  # "new case" while an answer was running: free it when that answer ends
        self.last_turn: LastTurn | None = None


class Generation:
    """One answer in progress. After each prefill/step call: `new_text`, `last_step` and `done` say what happened."""

    def __init__(
        self,
        request: GenerationRequest,
        prompt: Prompt,
        conversation: Conversation,
        stats: GenerationStats,
        skeleton: list[int] | None = None,
    ) -> None:
        self.request = request
        self.prompt = prompt
        self.conversation = conversation
        self.stats: GenerationStats = stats
        self.skeleton = skeleton  # the prompt with assistant texts left empty (see LastTurn); None: no conversation
        self.answer_ids: list[int] = []  # generated ids, stop token excluded (what the next turn may continue from)
        self.prefilled = len(conversation.ids)  # prompt tokens whose KV is in place
        self.pending: int | None = None  # sampled but not fed yet
        self.last_step: TokenStep | None = None
        self.new_text = ""
        self.done = False
        self.started = time.perf_counter()
        self.decoder: IncrementalDecoder | None = None
        # Set by a scheduler that detokenises on another thread: _accept then only queues token ids in `unsent`.
        self.defer_text = False
        self.unsent: list[int] = []
        self.flush_text = False  # the answer ended: the detokeniser flushes after `unsent`
        # Overlap (a backend whose decode inputs live on the device): the prompt's last chunk is queued, so a
        # decode step may be queued behind it before its first token reaches the host; and the positions whose
        # keys/values are queued (prompt plus decode steps launched), ahead of `conversation.ids` by the steps
        # in flight.
        self.device_ready = False
        self.device_length = len(conversation.ids)
        self.launched_tokens = 0  # answer tokens queued on the device (sampled by a launched prefill or step)

    @property
    def prefill_done(self) -> bool:
        return self.pending is not None or self.done

    def text_decoder(self) -> IncrementalDecoder:
        """The detokeniser InferenceBackend.start attached; a Generation made any other way has none."""
        if self.decoder is None:
            raise RuntimeError("This generation has no detokeniser: make generations with InferenceBackend.start().")
        return self.decoder


@dataclass
class Launch:
    """Work queued on the device whose results the host has not read yet. `InferenceBackend.complete` reads them
    and accepts the tokens, in launch order. result: the backend's handle (its `wait()` returns one TokenStep or
    None per entry), or None where the launch already ran synchronously."""

    kind: str  # "prefill" or "decode"
    generations: list[Generation]
    result: Any = None
    chunk_ends: list[int] = field(default_factory=list)  # prefill: each generation's chunk end
    fed: list[int | None] = field(default_factory=list)  # decode: the token each row feeds, when the host knows it


class InferenceBackend(abc.ABC):
    """A loaded model that answers questions about a film through the token-level contract.

    The public generation methods serialise on one lock, so direct callers may share a backend between threads;
    the serving layer drives each backend from one scheduler thread.
    """

    #: How many generations one `step` call may decode together (a static-cache backend's slots).
    max_batch: int = 1
    #: Longest prefill chunk; None: the whole prompt at once. Chunks never split an image's tokens.
    prefill_chunk_tokens: int | None = None
    #: True where a prefill may start inside an image whose first tokens' KV is in place (their KV already saw the
    #: whole image, and the chunk's image tokens attend to all of it): a cached prefix then need not stop at the
    #: image's start. The eager reference reads pixels inside its forward, so it cannot.
    resumes_inside_images: bool = False
    #: True where decode inputs live on the device (each sequence's last sampled token and position): a decode step
    #: can then be queued before the host has read the previous one (SGLang's overlap scheduler), and launch_*
    #: return before the device has finished. False: launch_* run synchronously and complete() has nothing to do.
    overlaps: bool = False

    def __init__(
        self,
        max_resident_conversations: int = DEFAULT_MAX_RESIDENT_CONVERSATIONS,
        image_cache_gib: float = DEFAULT_IMAGE_CACHE_GIB,
    ) -> None:
        self._closed = False
        self._close_lock = threading.Lock()
        self._lock = threading.RLock()
        self._resident: OrderedDict[str, Conversation] = OrderedDict()
        self.max_resident_conversations = max(0, int(max_resident_conversations))
        # False while a backend stands by after a hot switch: it keeps no conversation's KV memory.
        self.keep_conversations = True
        self.stop_token_ids: frozenset[int] = frozenset()
        self.image_token_id: int | None = None
        # Image soft tokens one film expands to (MedGemma: 256). Set, start() refuses a prompt whose count is not
        # exactly this per film: image markers typed into a question would otherwise place features out of range.
        self.image_tokens_per_film: int | None = None
        self.max_sequence: int | None = None  # longest conversation plus answer, where the backend has a limit
        self.image_cache = ImageFeatureCache(int(image_cache_gib * 2**30), _nbytes)
        # A backend with a KV block pool replaces this (and implements _load_prefix_impl / _save_prefix_impl).
        self.prefix_cache = PrefixBlockCache(0, 16)

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

    def prompt_length(self, request: GenerationRequest) -> int:
        """The tokens the request's prompt encodes to (image tokens included, no cache reuse counted): what a door
        checks against its limits before submitting. Encodes only (no image is read, no model call)."""
        return len(self._encode_impl(request).ids)

    def generate(self, request: GenerationRequest, stats: GenerationStats | None = None) -> str:
        return "".join(self.stream_generate(request, stats))

    def generate_steps(self, request: GenerationRequest) -> list[TokenStep]:
        """The generated tokens with their log-probabilities (stop token excluded): what verification compares."""
        stats = GenerationStats()
        for _ in self.stream_generate(request, stats):
            pass
        return [TokenStep(t, p) for t, p in zip(stats.token_ids, stats.token_logprobs, strict=True)]

    def next_token_logits(self, request: GenerationRequest) -> np.ndarray:
        """float32 logits (numpy, vocab-sized) of the first answer token: what a precision check compares as a
        whole distribution (KL), beyond the greedy token."""
        self.check_health()
        request.validate()
        with self._lock:
            prompt = self._encode_impl(request)
            kv = self._allocate()
            try:
                if self.image_token_id is not None and self.image_token_id in prompt.ids:
                    self._features_uncached(prompt)
                return self._prompt_logits_impl(kv, prompt)
            finally:
                self._free_impl(kv)

    def answer_logits(self, request: GenerationRequest, answer_ids: Sequence[int]) -> np.ndarray:
        """float32 logits, shape (len(answer_ids) + 1, vocab): the next-token distribution at every position of a
        given answer, each fed the answer's earlier tokens (teacher forcing), and the one after its last token.
        What a precision check compares over a whole answer, position by position, on the same text for both
        backends: free-running greedy answers part at the first different token and compare nothing after it."""
        import numpy as np

        self.check_health()
        request.validate()
        with self._lock:
            prompt = self._encode_impl(request)
            length = len(prompt.ids)
            prompt.ids = [*prompt.ids, *(int(token) for token in answer_ids)]
            kv = self._allocate()
            try:
                if self.image_token_id is not None and self.image_token_id in prompt.ids:
                    self._features_uncached(prompt)
                rows = [self._chunk_logits_impl(kv, prompt, 0, length)]
                for position in range(length, len(prompt.ids)):
                    rows.append(self._chunk_logits_impl(kv, prompt, position, position + 1))
                return np.stack([np.asarray(row, dtype=np.float32).ravel() for row in rows])
            finally:
                self._free_impl(kv)

    # --- many callers: what a scheduler drives ---------------------------------------------------------------------
    def start(
        self,
        request: GenerationRequest,
        stats: GenerationStats | None = None,
        image_hash: str | None = None,
        prior_hash: str | None = None,
    ) -> Generation:
        """Encode the request and place it on a conversation: a resident one when it can be reused, else a fresh one
        into which the longest cached prefix of the same film (and prior) is copied. image_hash, prior_hash: the
        films' content hashes when the caller computed them already (off the loop thread)."""
        self.check_health()
        request.validate()
        stats = stats if stats is not None else GenerationStats()
        with self._lock:
            image_key = prior_key = None
            if request.image is not None:
                image_key = image_hash or image_content_hash(request.image)
            if request.prior_image is not None:
                prior_key = prior_hash or image_content_hash(request.prior_image)
            films_key = f"{prior_key}>{image_key}" if prior_key is not None else image_key
            prompt, skeleton = self._encode_turns(request, films_key)
            if not prompt.ids:
                raise RequestError("the prompt encoded to no tokens")
            self._check_image_tokens(request, prompt)
            stats.prompt_tokens = len(prompt.ids)
            if self.max_sequence is not None and len(prompt.ids) + request.max_new_tokens > self.max_sequence:
                raise ConversationTooLongError(
                    f"the conversation ({len(prompt.ids)} tokens) plus the answer ({request.max_new_tokens}) exceeds "
                    f"this model's maximum of {self.max_sequence} tokens; start a new case to continue"
                )
            prompt.image_key = image_key if prompt.image is not None else None
            prompt.prior = request.prior_image
            prompt.prior_key = prior_key if request.prior_image is not None else None
            conversation = self._conversation_for(request.conversation_id, prompt)
            reused = len(conversation.ids)
            if not reused:
                self._copy_cached_prefix(conversation, prompt)
            generation = Generation(request, prompt, conversation, stats, skeleton)
            stats.reused_tokens = reused
            stats.prefix_cached_tokens = generation.prefilled - reused
            generation.decoder = IncrementalDecoder(self._detokenize_impl)
            return generation

    def _check_image_tokens(self, request: GenerationRequest, prompt: Prompt) -> None:
        """Refuse a prompt whose image soft tokens do not match its film: the question's own text carried image
        markers (a model's special token typed or pasted in). Its features would land out of range in the prefill."""
        per_film, image = self.image_tokens_per_film, self.image_token_id
        if per_film is None or image is None:
            return
        found = prompt.ids.count(image)
        films = len(request.films)
        expected = per_film * films
        if found != expected:
            raise RequestError(
                f"the conversation holds {found - expected:+d} image placeholder tokens beyond its "
                f"{'films' if films > 1 else 'film'}' {expected}: a question contains the model's image markers "
                "(such as <image_soft_token>); remove them from the question and ask again"
            )

    def prepare_images(self, generations: Sequence[Generation]) -> None:
        """Encode the films of the generations that still need them, as one vision batch."""
        with self._lock:
            waiting = [g for g in generations if g.prompt.features is None and self._needs_image(g)]
            if waiting:
                self._prepare_images([g.prompt for g in waiting], [_film_hints(g.request) for g in waiting])

    def _prepare_images(self, prompts: list[Prompt], hints: list[tuple[str | None, ...]]) -> None:
        """Features from the image cache where it holds a film; the rest through the vision tower, each distinct
        film once, as one batch. Each film is cached on its own (a prior and its current film are two entries),
        and a prompt's features are its films' rows in prompt order."""
        if all(len(prompt.films) <= 1 for prompt in prompts):  # one film each: the prompts are the films
            self._prepare_films(prompts, [hint[-1] if hint else None for hint in hints])
            return
        films = [[Prompt([], film, key) for film, key in prompt.films] for prompt in prompts]
        film_hints = [
            hint[index] if index < len(hint) else None
            for group, hint in zip(films, hints, strict=True)
            for index in range(len(group))
        ]
        self._prepare_films([film for group in films for film in group], film_hints)
        for prompt, group in zip(prompts, films, strict=True):
            rows = [film.features for film in group]
            if rows and all(row is not None for row in rows):  # None: the backend reads pixels in its prefill
                prompt.features = _joined_features(rows)

    def _prepare_films(self, prompts: list[Prompt], hints: list[str | None]) -> None:
        """_prepare_images for prompts that hold one film each."""
        misses: dict[str, list[Prompt]] = {}
        uncached: list[Prompt] = []
        for prompt, hint in zip(prompts, hints, strict=True):
            key = prompt.image_key
            cached = self.image_cache.get(key, hint) if key is not None else None
            if cached is not None:
                prompt.features = cached
            elif key is None:
                uncached.append(prompt)
            else:
                misses.setdefault(key, []).append(prompt)
        if not misses and not uncached:
            return
        first = [group[0] for group in misses.values()]
        self._prepare_images_impl(first + uncached)
        self.image_cache.encoder_calls += len(first) + len(uncached)
        for key, group in misses.items():
            features = group[0].features
            if features is None:  # a backend that reads the pixels inside its prefill (the eager reference)
                continue
            self.image_cache.put(key, features)
            for prompt in group[1:]:
                prompt.features = features

    def _features_uncached(self, prompt: Prompt) -> None:
        """prompt.features through the vision tower, the image cache left alone (what the precision checks read)."""
        if len(prompt.films) <= 1:
            self._prepare_images_impl([prompt])
            return
        films = [Prompt([], film, None) for film, _ in prompt.films]
        self._prepare_images_impl(films)
        if all(film.features is not None for film in films):
            prompt.features = _joined_features([film.features for film in films])

    def prefill(self, generation: Generation, budget_tokens: int | None = None) -> bool:
        """Feed the next chunk of the prompt (at most budget_tokens). True once the first answer token is sampled."""
        self.check_health()
        if generation.prefill_done:
            return True
        return self.prefill_batch([generation], budget_tokens)[0]

    def prefill_batch(self, generations: Sequence[Generation], budget_tokens: int | None = None) -> list[bool]:
        """Feed the next chunk of each generation's prompt in one model call where the backend can (packed), with
        at most budget_tokens prompt tokens in all, first come first served. Each generation gets a chunk while
        budget is left; chunks never split an image. Returns, per generation, whether its first answer token is
        now sampled."""
        launch = self.launch_prefill(generations, budget_tokens)
        if launch is not None:
            self.complete(launch)
        return [g.prefill_done for g in generations]

    def launch_prefill(self, generations: Sequence[Generation], budget_tokens: int | None = None) -> Launch | None:
        """prefill_batch's chunks, queued: on an overlapping backend the call returns before the device is done,
        and a generation whose last chunk is queued may join a decode launch at once (device_ready). None: no
        generation had a chunk to feed."""
        self.check_health()
        with self._lock:
            chunks, left = [], budget_tokens
            for generation in generations:
                if generation.prefill_done or generation.device_ready or (left is not None and left <= 0):
                    continue
                if self._needs_image(generation) and generation.prompt.features is None:
                    self._prepare_images([generation.prompt], [_film_hints(generation.request)])
                start = generation.prefilled
                end = self._chunk_end(generation.prompt, start, left)
                chunks.append((generation, start, end))
                if left is not None:
                    left -= end - start
            if not chunks:
                return None
            items = [(g.conversation.kv, g.prompt, start, end, end == len(g.prompt.ids)) for g, start, end in chunks]
            result = self._launch_prefill_impl(items) if self.overlaps else _Ready(self._prefill_batch_impl(items))
            launch = Launch("prefill", [g for g, _, _ in chunks], result, [end for _, _, end in chunks])
            for generation, start, end in chunks:
                generation.conversation.ids.extend(generation.prompt.ids[start:end])
                generation.prefilled = generation.device_length = end
                if end == len(generation.prompt.ids):
                    self._save_prefix(generation.conversation, generation.prompt)
                    generation.device_ready = True
                    generation.launched_tokens = 1
            if not self.overlaps:
                self._complete_locked(launch)
            return launch

    def launch_step(self, generations: Sequence[Generation]) -> list[Launch]:
        """Queue one decode step for each generation that can take one (one launch per max_batch rows). On an
        overlapping backend a generation whose last sampled token is still on the device takes part: the step
        feeds it there. A generation that has all the tokens it may sample queued takes no part."""
        self.check_health()
        with self._lock:
            if self.overlaps:
                active = [g for g in generations if self._may_launch(g)]
            else:
                active = [g for g in generations if not g.done and g.pending is not None]
            launches = []
            for index in range(0, len(active), max(1, self.max_batch)):
                chunk = active[index : index + self.max_batch]
                kvs = [g.conversation.kv for g in chunk]
                positions = [g.device_length for g in chunk]
                if self.overlaps:
                    launch = Launch("decode", chunk, self._launch_decode_impl(kvs, positions), fed=[None] * len(chunk))
                else:
                    tokens = [g.pending for g in chunk if g.pending is not None]  # all: `active` has no None
                    steps = self._decode_impl(kvs, tokens, positions)
                    launch = Launch("decode", chunk, _Ready(steps), fed=list[int | None](tokens))
                for generation in chunk:
                    generation.device_length += 1
                    generation.launched_tokens += 1
                if not self.overlaps:
                    self._complete_locked(launch)
                launches.append(launch)
            return launches

    def _may_launch(self, generation: Generation) -> bool:
        return (
            not generation.done
            and generation.device_ready
            and generation.launched_tokens < generation.request.max_new_tokens
            and (self.max_sequence is None or generation.device_length < self.max_sequence)
        )

    def complete(self, launch: Launch) -> None:
        """Read a launch's tokens (waiting for the device if it is not done) and accept them. Launches complete in
        the order they were made; rows of generations that ended meanwhile (a stop token, a cancel) are dropped."""
        with self._lock:
            self._complete_locked(launch)

    def _complete_locked(self, launch: Launch) -> None:
        result, launch.result = launch.result, None
        if result is None:  # completed already
            return
        steps = result.wait()
        if launch.kind == "prefill":
            for generation, end, step in zip(launch.generations, launch.chunk_ends, steps, strict=True):
                if end != len(generation.prompt.ids) or generation.done:
                    continue
                if step is None:
                    raise RuntimeError(
                        f"{type(self).__name__}'s prefill returned no token for a prompt's last chunk "
                        "(want_token was True); the backend breaks the contract."
                    )
                self._accept(generation, step)
            return
        for generation, fed, step in zip(launch.generations, launch.fed, steps, strict=True):
            if generation.done:
                continue  # a row queued before the host saw its answer end: its token is dropped
            token = generation.pending if fed is None else fed
            if token is None:
                raise RuntimeError("a decode step completed before the prefill it follows; complete launches in order")
            generation.conversation.ids.append(token)
            self._accept(generation, step)

    def step(self, generations: Sequence[Generation]) -> None:
        """Decode one token for each generation (one batched call where the backend can)."""
        for launch in self.launch_step(generations):
            self.complete(launch)

    def run_together(self, generations: Sequence[Generation]) -> None:
        """Prefill each generation to its first token, one after another, then decode them as one batch until
        every one is done (rows leave the batch as they finish). The caller finishes them. What the scheduler does
        when nothing else arrives: the tests and benchmarks that compare a batch with each request alone use it."""
        self.prepare_images(generations)  # every film in one vision batch
        for generation in generations:
            while not self.prefill(generation):
                pass
        while not all(g.done for g in generations):
            self.step(generations)

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
            conversation_id = conversation.conversation_id
            keep = (
                conversation_id is not None
                and not conversation.forgotten
                and self.max_resident_conversations > 0
                and self.keep_conversations
                and not self._closed
            )
            if keep and conversation_id is not None:  # (keep implies it; mypy does not follow `keep`)
                # Two answers under one id run on two conversations (the second found no resident one): the one that
                # ends last stays resident, and the other's KV is freed here, not leaked.
                replaced = self._resident.pop(conversation_id, None)
                if replaced is not None and replaced is not conversation:
                    self._free(replaced)
                if generation.skeleton is not None:
                    conversation.last_turn = LastTurn(
                        generation.skeleton,
                        generation.prompt.ids,
                        tuple(turn.text for turn in generation.request.turns[1::2]),
                        generation.answer_ids,
                    )
                self._resident[conversation_id] = conversation
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
    def image_features(self, images: Sequence[Any]) -> np.ndarray:
        """Projected image embeddings, float32 numpy of shape (len(images), 256, text hidden size)."""
        self.check_health()
        if not images:
            raise RequestError("image_features needs at least one image")
        with self._lock:
            if self.image_cache.capacity_bytes <= 0:
                return self._image_features_impl(list(images))
            # Through the image cache, so a folder's features serve its reports (and the reverse) without running
            # the vision tower twice per film.
            prompts = [Prompt([], image, image_content_hash(image)) for image in images]
            self._prepare_images(prompts, [(None,)] * len(prompts))
            if any(prompt.features is None for prompt in prompts):  # a backend that encodes inside its prefill
                return self._image_features_impl(list(images))
            return _stack_float32([prompt.features for prompt in prompts])

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
            self.image_cache.clear()
            self.prefix_cache.clear()
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
        deferred = generation.defer_text
        if step.token_id in self.stop_token_ids:
            generation.done, stats.finish_reason = True, "stop"
            if deferred:
                generation.flush_text = True
            else:
                generation.new_text = generation.text_decoder().flush()
            return
        if stats.first_token_s is None:
            stats.first_token_s = time.perf_counter() - generation.started
        generation.answer_ids.append(step.token_id)
        stats.new_tokens += 1
        stats.token_ids.append(step.token_id)
        stats.token_logprobs.append(step.logprob)
        stats.token_times.append(time.perf_counter())
        if deferred:
            generation.unsent.append(step.token_id)
        else:
            text = generation.text_decoder().push(step.token_id)
            stats.token_texts.append(text)
            generation.new_text = text
        if stats.new_tokens >= generation.request.max_new_tokens:
            generation.done, stats.finish_reason = True, "length"
            if deferred:
                generation.flush_text = True
            else:
                generation.new_text += generation.text_decoder().flush()
        else:
            generation.pending = step.token_id

    @staticmethod
    def take_unsent(generation: Generation) -> tuple[list[int], bool]:
        """On the thread that steps: the token ids _accept queued for a deferred generation, and whether the
        answer ended (the detokeniser must flush after them)."""
        ids, generation.unsent = generation.unsent, []
        flush, generation.flush_text = generation.flush_text, False
        return ids, flush

    @staticmethod
    def detokenize(generation: Generation, ids: list[int], flush: bool) -> str:
        """On one other thread, in order: the text those ids add (stats.token_texts too, as inline)."""
        text = ""
        for token in ids:
            piece = generation.text_decoder().push(token)
            generation.stats.token_texts.append(piece)
            text += piece
        return text + (generation.text_decoder().flush() if flush else "")

    def _encode_turns(self, request: GenerationRequest, films_key: str | None) -> tuple[Prompt, list[int] | None]:
        """The prompt to feed, and its skeleton (see LastTurn) when the request names a conversation.

        A follow-up to a resident conversation continues from the exact ids of its previous turns (whose KV is
        resident) instead of their re-tokenised text, when the request's history is the one that conversation
        answered: same film, same earlier turns, and the previous answer's text equal to the decoding of the ids
        generated for it. The prompt is then what a fresh conversation given that token history would be fed.
        Anything else (an edited history, another film, an evicted conversation) encodes the text as it is."""
        if request.conversation_id is None:
            return self._encode_impl(request), None
        if len(request.turns) < 2:  # a first question: no answer to leave out
            prompt = self._encode_impl(request)
            return prompt, list(prompt.ids)
        blank = tuple(ChatTurn(turn.role, "" if turn.role == "assistant" else turn.text) for turn in request.turns)
        prompt = self._encode_impl(replace(request, turns=blank))
        skeleton = list(prompt.ids)
        resident = self._resident.get(request.conversation_id)
        spliced = self._continue_turn(resident, request, films_key, skeleton) if resident is not None else None
        if spliced is None:
            return self._encode_impl(request), skeleton
        prompt.ids = spliced
        return prompt, skeleton

    def _continue_turn(
        self, resident: Conversation, request: GenerationRequest, films_key: str | None, skeleton: list[int]
    ) -> list[int] | None:
        """The follow-up's ids built on the resident conversation's last turn, or None where that would be wrong."""
        last = resident.last_turn
        if last is None or resident.image_key != films_key:
            return None
        answers = tuple(turn.text for turn in request.turns[1::2])
        if answers[:-1] != last.answers:
            return None
        if last.answer_text is None:
            last.answer_text = self._detokenize_impl(last.answer_ids)
        if answers[-1] != last.answer_text:  # not the answer this conversation gave (cleared, rewritten)
            return None
        done = len(last.skeleton)
        if len(skeleton) <= done or skeleton[:done] != last.skeleton:
            return None
        return [*last.prompt_ids, *last.answer_ids, *skeleton[done:]]

    def _conversation_for(self, conversation_id: str | None, prompt: Prompt) -> Conversation:
        resident = self._resident.pop(conversation_id, None) if conversation_id is not None else None
        if resident is not None:
            reuse = self._reusable_prefix(resident, prompt)
            if reuse > 0 and (reuse == len(resident.ids) or self._truncate_impl(resident.kv, reuse)):
                del resident.ids[reuse:]
                resident.in_use = True
                return resident
            self._free(resident)
        conversation = Conversation(conversation_id, prompt.films_key, self._allocate())
        conversation.in_use = True
        return conversation

    def _reusable_prefix(self, conversation: Conversation, prompt: Prompt) -> int:
        """Tokens of the cached conversation the new prompt starts with; never all of them (logits are needed)."""
        if conversation.image_key != prompt.films_key:
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

    def _prefix_root(self, prompt: Prompt) -> str | None:
        """The chain root of a prompt's prefix blocks: the film's content hash (no film: a fixed text-only root).
        None when the prompt has image tokens but no known film, which then never shares."""
        has_image = self.image_token_id is not None and self.image_token_id in prompt.ids
        if not has_image:
            return TEXT_ONLY_ROOT
        films_key = prompt.films_key
        return f"image:{films_key}" if films_key else None

    def _copy_cached_prefix(self, conversation: Conversation, prompt: Prompt) -> None:
        """The longest cached run of this film's leading prompt blocks placed in the new conversation: by reference
        where the backend's cache holds pages (paged KV), else copied in (copy-on-admit)."""
        root = self._prefix_root(prompt)
        if root is None or not self.prefix_cache.enabled:
            return
        pool_ids = self.prefix_cache.lookup(root, prompt.ids, len(prompt.ids) - 1)  # the last token is prefilled
        length = len(pool_ids) * self.prefix_cache.block_tokens
        image = self.image_token_id
        if not self.resumes_inside_images and image is not None and 0 < length < len(prompt.ids):
            # Never resume inside an image (the same rule as a resident conversation's reuse).
            while length > 0 and prompt.ids[length] == image and prompt.ids[length - 1] == image:
                length -= 1
        if length <= 0:
            return
        blocks = -(-length // self.prefix_cache.block_tokens)
        self._load_prefix_impl(conversation.kv, pool_ids[:blocks], length)
        conversation.ids = list(prompt.ids[:length])

    def _save_prefix(self, conversation: Conversation, prompt: Prompt) -> None:
        """After a whole prompt is prefilled: its full blocks not cached yet go into the block pool."""
        root = self._prefix_root(prompt)
        if root is None or not self.prefix_cache.enabled:
            return
        if self.prefix_cache.by_reference:  # the conversation's own pages become the cached blocks: no copy
            self.prefix_cache.adopt(
                root,
                conversation.ids[: len(prompt.ids)],
                self._prefix_pages_impl(conversation.kv),
                self._hold_page_impl,
            )
            return
        # Blocks already cached need no copy: reserve() skips them and refreshes their place in the LRU order.
        wanted = self.prefix_cache.reserve(root, conversation.ids[: len(prompt.ids)], 0)
        if wanted:
            self._save_prefix_impl(conversation.kv, wanted)

    def _allocate(self) -> Any:
        while True:
            try:
                return self._allocate_impl()
            except NoFreeSlotError:
                if not self._resident:
                    raise
                self._free(self._resident.popitem(last=False)[1])  # the least recently used idle conversation

    def _reclaim_idle_conversation(self) -> bool:
        """Free the least recently used idle conversation's KV (a backend short of KV memory). False if none."""
        if not self._resident:
            return False
        self._free(self._resident.popitem(last=False)[1])
        return True

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
    def _decode_impl(self, kvs: list[Any], tokens: list[int], positions: list[int]) -> list[TokenStep]:
        """Feed tokens[i] at positions[i] into kvs[i]; return each sequence's greedy next token."""

    @abc.abstractmethod
    def _prompt_logits_impl(self, kv: Any, prompt: Prompt) -> np.ndarray:
        """Prefill the whole prompt into an empty kv; return the next token's float32 logits as a numpy array."""

    def _chunk_logits_impl(self, kv: Any, prompt: Prompt, start: int, end: int) -> np.ndarray:
        """Feed prompt.ids[start:end] into kv (which holds prompt.ids[:start]); return the float32 logits after
        the chunk's last token. Needed only by answer_logits (precision checks)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot score a given answer position by position (answer_logits): it does not "
            "implement _chunk_logits_impl"
        )

    def _prefill_batch_impl(self, items: list[tuple[Any, Prompt, int, int, bool]]) -> list[TokenStep | None]:
        """Several (kv, prompt, start, end, want_token) chunks; a backend that can packs them into one forward."""
        return [self._prefill_impl(kv, prompt, start, end, want) for kv, prompt, start, end, want in items]

    def _launch_prefill_impl(self, items: list[tuple[Any, Prompt, int, int, bool]]) -> Any:
        """An overlapping backend: queue _prefill_batch_impl's work, leaving each last chunk's token on the device
        as that sequence's next input; return a handle whose wait() gives _prefill_batch_impl's list."""
        raise NotImplementedError(f"{type(self).__name__} sets overlaps but does not implement _launch_prefill_impl")

    def _launch_decode_impl(self, kvs: list[Any], positions: list[int]) -> Any:
        """An overlapping backend: queue one decode step feeding each sequence's last sampled token (on the device)
        at positions[i]; return a handle whose wait() gives one TokenStep per sequence."""
        raise NotImplementedError(f"{type(self).__name__} sets overlaps but does not implement _launch_decode_impl")

    def _prefix_pages_impl(self, kv: Any) -> list[int]:
        """A cache that holds pages by reference: the pages kv reads, in position order."""
        raise NotImplementedError(f"{type(self).__name__} shares prefix pages but does not list a sequence's pages")

    def _hold_page_impl(self, page: int) -> None:
        """A cache that holds pages by reference: one more holder of `page`."""
        raise NotImplementedError(f"{type(self).__name__} shares prefix pages but does not count their holders")

    def _load_prefix_impl(self, kv: Any, pool_ids: list[int], length: int) -> None:
        """Place cached blocks pool_ids (in order) at kv's positions 0..length-1: copied in from a block pool, or,
        where the cache holds pages by reference, read in place through kv's block table."""
        raise NotImplementedError(
            f"{type(self).__name__} set a prefix block pool but does not implement _load_prefix_impl; a backend "
            "without a pool keeps the contract's empty PrefixBlockCache, which never calls this"
        )

    def _save_prefix_impl(self, kv: Any, blocks: list[tuple[int, int]]) -> None:
        """Copy kv's prompt block `index` (positions index*B..(index+1)*B-1) into pool block `pool_id`, per pair."""
        raise NotImplementedError(
            f"{type(self).__name__} set a prefix block pool but does not implement _save_prefix_impl; a backend "
            "without a pool keeps the contract's empty PrefixBlockCache, which never calls this"
        )

    def cache_stats(self) -> dict[str, Any]:
        """Counters for the shared caches and the KV slots, read by metrics and the benchmark (any thread)."""
        return {
            "mm_cache": self.image_cache.stats(),
            "prefix_cache": self.prefix_cache.stats(),
            "kv_cache_usage": self._kv_usage(),
        }

    def _kv_usage(self) -> float | None:
        """Fraction of the backend's KV capacity in use (0..1); None where it has no fixed capacity."""
        return None

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
    def _image_features_impl(self, images: list[Any]) -> np.ndarray: ...

    @abc.abstractmethod
    def _info_impl(self) -> BackendInfo: ...

    def _warm_up_impl(self) -> None:
        from PIL import Image

        request = GenerationRequest(Image.new("RGB", (896, 896)), (ChatTurn("user", "Warm-up."),), max_new_tokens=2)
        for _ in self.stream_generate(request):
            pass

    @abc.abstractmethod
    def _close_impl(self) -> None: ...


class _Ready:
    """A synchronous backend's results, in the shape of an overlapping backend's handle."""

    def __init__(self, steps: Sequence[TokenStep | None]) -> None:
        self._steps = list(steps)

    def wait(self) -> list[TokenStep | None]:
        return self._steps


def _film_hints(request: GenerationRequest) -> tuple[str | None, ...]:
    """The caller's keys of a request's films, in prompt order (the image cache's hints)."""
    if request.prior_image is not None:
        return (request.prior_image_key, request.image_key)
    return (request.image_key,)


def _joined_features(rows: list[Any]) -> Any:
    """Several films' feature rows as one (films * tokens, hidden) array, in order: torch tensors or numpy."""
    if len(rows) == 1:
        return rows[0]
    flat = [row.reshape(-1, row.shape[-1]) for row in rows]
    if hasattr(flat[0], "cpu"):
        import torch

        return torch.cat(flat)
    import numpy as np

    return np.concatenate(flat)


def _stack_float32(rows: list[Any]) -> np.ndarray:
    """(n, tokens, hidden) float32 numpy from per-film feature rows (torch tensors on any device, or numpy)."""
    import numpy as np

    arrays = [row.float().cpu().numpy() if hasattr(row, "cpu") else np.asarray(row, dtype=np.float32) for row in rows]
    return np.stack(arrays).astype(np.float32)


def _nbytes(value: Any) -> int:
    """Bytes held by a feature array: a torch tensor or a numpy array."""
    return int(getattr(value, "nbytes", 0) or value.numel() * value.element_size())
