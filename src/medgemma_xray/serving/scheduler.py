"""Iteration-level batching: one thread drives every answer of one backend through the token-level contract.

Each loop turn (a "step" in vLLM's words) has a token budget, `max_batched_tokens`: one decode token for every
running answer, and the rest for prompt chunks. A turn drops cancelled answers, admits waiting ones (a cached
prefix of the same film is placed in each: by reference on a paged backend, copied on others; films not in the
image cache go through the vision tower once each, as one batch), queues the chunks of every waiting prompt that
fit in the budget as one packed prefill, first come first served, queues one decode step for every running answer
as one batched call, and only then reads the previous turn's tokens. So a new arrival costs running streams one
longer turn, never a queue of prompts one at a time, and on a backend whose decode inputs live on the device the
GPU already has this turn's work while Python reads the last. An answer joins the batch in the turn its prompt's
last chunk is queued and leaves it when the host sees it stop; a closed browser tab frees its slot at the next turn.

Taken from vLLM's V1 scheduler: the per-step token budget shared by decodes and chunked prefills (decodes first,
so running streams never starve), prefix-cache hits counted in tokens at admission, and its asynchronous scheduling
(the next step is scheduled before the last one's output is processed). From SGLang: admit new prompts while any
budget is left (its "prefill-first when there is room" policy); its overlap scheduler (each sequence's next input
token stays on the device, so step N+1 is launched before the host reads step N, at the cost of one discarded
step when an answer stops on its stop token); and detokenisation off the GPU loop: token ids go to a second
thread (SGLang's detokenizer process, vLLM's output processor), which turns them into text for the handlers. The
loop thread only schedules, launches and reads ids. A prompt that breaks a packed prefill is retried alone, so it
fails alone and as the request's fault. Not taken: preemption and swapping (a conversation's KV is never evicted
while it answers; the slot count bounds the batch instead), and speculative decoding.

Why not transformers' continuous-batching manager: in 5.17 it takes token ids only (no images), and it drops its
fast paths on sliding-window models such as Gemma 3. The contract's backends bring their own KV layouts (a
DynamicCache, the fast path's paged cache, an engine's buffers), so the scheduler only orders calls.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator

from medgemma_xray.inference_api.contract import Generation, InferenceBackend, Launch
from medgemma_xray.inference_api.errors import RequestError, one_line
from medgemma_xray.inference_api.shared_caches import image_content_hash
from medgemma_xray.inference_api.types import GenerationRequest, GenerationStats

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCHED_TOKENS = 2048  # tokens per turn: running answers' decode tokens plus prompt chunks (vLLM's)
MIN_PREFILL_TOKENS = 256  # prompt tokens a turn always admits, however many answers are decoding


class SchedulerBusyError(RuntimeError):
    """The waiting queue is full: the user should retry in a minute."""


class SchedulerClosedError(RuntimeError):
    """The scheduler no longer admits work (its backend was switched out or the server is stopping)."""


class AnswerTimeoutError(TimeoutError):
    """No progress within the deadline: a hung or overloaded backend."""


class Ticket:
    """One answer's place in the scheduler. The handler thread reads its text deltas as they are produced."""

    def __init__(
        self,
        request: GenerationRequest,
        stats: GenerationStats,
        image_hash: str | None = None,
        prior_hash: str | None = None,
    ) -> None:
        self.request, self.stats = request, stats
        self.image_hash = image_hash  # the film's content hash, computed by the submitting thread
        self.prior_hash = prior_hash  # the prior film's, where the request compares two
        self.submitted_at = time.perf_counter()
        self.admitted_at: float | None = None  # when the backend started on it (queue wait excluded)
        self.finished_at: float | None = None
        self.generation: Generation | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._admitted = threading.Event()

    @property
    def started(self) -> Generation:
        """The generation, for the loop: every ticket in its prefilling and active lists has been admitted."""
        if self.generation is None:
            raise RuntimeError("This ticket has not been admitted yet, so it has no generation.")
        return self.generation

    # --- handler side -------------------------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def deltas(self, admission_timeout_s: float, progress_timeout_s: float) -> Iterator[str]:
        """Text deltas until the answer ends. Raises what the backend raised, or AnswerTimeoutError when the
        answer waits longer than admission_timeout_s to start or runs longer than progress_timeout_s once started.
        Events already produced are always delivered, however slowly the caller reads them."""
        while True:
            try:
                # Short polls: the deadline moves from the admission budget to the progress budget once admitted.
                kind, value = self._events.get(
                    timeout=min(0.05, self._wait_budget(admission_timeout_s, progress_timeout_s))
                )
            except queue.Empty:
                if self._wait_budget(admission_timeout_s, progress_timeout_s) > 0.001:
                    continue
                if self.admitted_at is None:
                    raise AnswerTimeoutError(f"the answer waited {admission_timeout_s:g} s for a free slot") from None
                raise AnswerTimeoutError(
                    f"the answer was not finished {progress_timeout_s:g} s after it started"
                ) from None
            if kind == "text":
                yield value
            elif kind == "error":
                raise value
            else:
                return

    def _wait_budget(self, admission_timeout_s: float, progress_timeout_s: float) -> float:
        now = time.perf_counter()
        if self.admitted_at is None:
            return max(0.0, self.submitted_at + admission_timeout_s - now) + 0.001
        return max(0.0, self.admitted_at + progress_timeout_s - now) + 0.001

    # --- scheduler side -------------------------------------------------------------------------------------
    def _admit(self, generation: Generation) -> None:
        self.generation, self.admitted_at = generation, time.perf_counter()

    def _text(self, delta: str) -> None:
        if delta:
            self._events.put(("text", delta))

    def _end(self, error: BaseException | None = None) -> None:
        if self.finished_at is None:
            self.finished_at = time.perf_counter()
            self._events.put(("error", error) if error is not None else ("done", None))


class Scheduler:
    """Owns one backend's generation calls. `submit` is thread-safe; everything else runs on the loop thread."""

    def __init__(
        self,
        backend: InferenceBackend,
        max_active: int,
        max_waiting: int,
        name: str = "scheduler",
        max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    ) -> None:
        self.backend = backend
        self.max_active = max(1, int(max_active))
        self.max_waiting = max(1, int(max_waiting))
        self.max_batched_tokens = max(MIN_PREFILL_TOKENS, int(max_batched_tokens))
        self._waiting: deque[Ticket] = deque()
        self._prefilling: list[Ticket] = []
        self._active: list[Ticket] = []
        self._cond = threading.Condition()
        self._closing = False
        # (ticket, token ids, flush, done, error) in order; None ends the output thread. Both threads are joined
        # by close().
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        # Seconds the loop spent in each part of its turns (and how many turns, prompts, decode rows): what a
        # profile of a busy second reads (turn_profile()).
        self._profile = dict.fromkeys(
            (
                "turns",
                "admit_s",
                "start_s",
                "prefill_s",
                "decode_s",
                "wait_s",
                "emit_s",
                "prefill_prompts",
                "decode_rows",
                "launches_read_late",
            ),
            0.0,
        )
        self._in_flight: list[Launch] = []  # the last turn's launches, read at the next turn (overlap)
        self._output_thread = threading.Thread(target=self._output_loop, name=f"{name}-output", daemon=True)
        self._output_thread.start()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # --- any thread ---------------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, stats: GenerationStats | None = None) -> Ticket:
        image_hash = image_content_hash(request.image) if request.image is not None else None
        prior_hash = image_content_hash(request.prior_image) if request.prior_image is not None else None
        preprocess = getattr(self.backend, "preprocess_film", None)  # the films' pixels off the loop
        for film, key in ((request.prior_image, prior_hash), (request.image, image_hash)):
            if preprocess is not None and key is not None:
                try:
                    preprocess(film, key)
                except Exception as exc:  # the loop preprocesses it again and reports the failure with the answer
                    logger.warning("preprocessing the film early failed: %s: %s", type(exc).__name__, one_line(exc))
        ticket = Ticket(request, stats if stats is not None else GenerationStats(), image_hash, prior_hash)
        with self._cond:
            if self._closing:
                raise SchedulerClosedError("this backend no longer takes new answers")
            if len(self._waiting) >= self.max_waiting:
                raise SchedulerBusyError(f"{len(self._waiting)} answers are already waiting")
            self._waiting.append(ticket)
            self._cond.notify()
        return ticket

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active) + len(self._prefilling)

    def close(self, timeout_s: float | None = None) -> bool:
        """Stop admitting; let running and waiting answers finish; end the loop. True if it ended in time."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        started = time.monotonic()
        self._thread.join(timeout_s)
        loop_ended = not self._thread.is_alive()
        self._outbox.put(None)  # after the loop's last event, so every answer's text is delivered first
        left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))
        self._output_thread.join(left)
        return loop_ended and not self._output_thread.is_alive()

    # --- the output thread: text for the handlers, off the GPU loop ----------------------------------------------
    def _output_loop(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            ticket, ids, flush, done, error = item
            try:
                if ids or flush:
                    ticket._text(self.backend.detokenize(ticket.generation, ids, flush))
            except Exception as exc:  # a tokenizer failure ends this answer, not the thread
                logger.error("detokenisation failed: %s: %s", type(exc).__name__, one_line(exc))
                error, done = error or exc, True
            if done:
                ticket._end(error)

    # --- the loop thread --------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._prefilling or self._active or self._in_flight or self._closing):
                    self._cond.wait()
                if self._closing and not (self._waiting or self._prefilling or self._active or self._in_flight):
                    return
            try:
                self._turn()
            except BaseException as exc:  # a backend failure ends every answer it touched, and the loop goes on
                logger.error("backend call failed: %s: %s", type(exc).__name__, one_line(exc))
                self._fail_all(exc)

    def turn_profile(self) -> dict[str, float]:
        """Cumulative seconds in admission (incl. vision), prefill, decode and hand-off, with counts (any thread)."""
        return dict(self._profile)

    def _turn(self) -> None:
        """Queue this turn's prefill chunks and decode step, then read the previous turn's results while the device
        works on them (SGLang's overlap scheduler; on a backend that does not overlap, launches run synchronously
        and the previous turn has nothing left to read)."""
        profile, clock = self._profile, time.perf_counter
        began = clock()
        self._drop_cancelled()
        self._admit_waiting()
        admitted = clock()
        profile["admit_s"] += admitted - began
        launches: list[Launch] = []
        if self._prefilling:
            profile["prefill_prompts"] += len(self._prefilling)
            launches.extend(self._launch_prefill(self._prefill_budget()))
            ready = [t for t in self._prefilling if t.started.device_ready or t.started.done]
            self._prefilling = [t for t in self._prefilling if not (t.started.device_ready or t.started.done)]
            self._active.extend(ready)
        prefilled = clock()
        profile["prefill_s"] += prefilled - admitted
        if self._active:
            profile["decode_rows"] += len(self._active)
            launches.extend(self.backend.launch_step([ticket.started for ticket in self._active]))
        launched = clock()
        profile["decode_s"] += launched - prefilled
        previous, self._in_flight = self._in_flight, launches
        if launches:
            profile["launches_read_late"] += len(previous)
        if not self.backend.overlaps:
            previous = [*previous, *launches]  # complete already: nothing waits
        waited = emitted = 0.0
        for launch in previous:  # the device is busy with this turn's launches meanwhile
            began_wait = clock()
            self.backend.complete(launch)
            began_emit = clock()
            waited += began_emit - began_wait
            ended = set()
            for ticket in self._tickets_of(launch):  # each launch's tokens go out as soon as they are read
                self._emit(ticket)
                if ticket.started.done:
                    ended.add(id(ticket))
            if ended:  # only what was just emitted: an answer that ended in a later launch is emitted with it
                self._active = [ticket for ticket in self._active if id(ticket) not in ended]
            emitted += clock() - began_emit
        profile["wait_s"] += waited
        profile["emit_s"] += emitted
        profile["turns"] += 1

    def _tickets_of(self, launch: Launch) -> list[Ticket]:
        """The running tickets whose generations a launch served (ended ones were emitted and dropped already)."""
        served = {id(generation) for generation in launch.generations}
        return [ticket for ticket in self._active if id(ticket.started) in served]

    def _prefill_budget(self) -> int:
        """Prompt tokens this turn may prefill: the step's budget less one decode token per running answer."""
        return max(MIN_PREFILL_TOKENS, self.max_batched_tokens - len(self._active))

    def _launch_prefill(self, budget: int) -> list[Launch]:
        """One packed launch for every waiting prompt. When it raises, each prompt is tried alone, so a prompt that
        breaks the prefill fails alone: its batch-mates go on, and it fails as the request's fault (a RequestError,
        which the circuit breaker never counts), unless every prompt fails alone (then the backend is at fault)."""
        generations = [ticket.started for ticket in self._prefilling]
        try:
            launch = self.backend.launch_prefill(generations, budget)
            return [launch] if launch is not None else []
        except Exception as exc:
            logger.error("prefill failed: %s: %s", type(exc).__name__, one_line(exc))
            batch_error: BaseException = exc
        if len(self._prefilling) == 1:
            self._end(self._prefilling[0], batch_error)
            self._prefilling = []
            return []
        launches, failed = [], []
        for ticket in self._prefilling:
            try:
                launch = self.backend.launch_prefill([ticket.started], budget)
            except Exception as exc:
                failed.append((ticket, exc))
                continue
            if launch is not None:
                launches.append(launch)
        if len(failed) == len(self._prefilling):  # none succeeded alone: the backend, not a prompt, is at fault
            for ticket, _ in failed:
                self._end(ticket, batch_error)
        else:
            for ticket, own_error in failed:
                logger.warning(
                    "a prompt failed its prefill alone: %s: %s", type(own_error).__name__, one_line(own_error)
                )
                self._end(ticket, _prompt_error(own_error))
        dropped = {id(ticket) for ticket, _ in failed}
        self._prefilling = [ticket for ticket in self._prefilling if id(ticket) not in dropped]
        return launches

    def _admit_waiting(self) -> None:
        """Start waiting answers while this turn's prefill budget has room for their prompts (vLLM admits a request
        only when its tokens fit the step), so the films admitted in one turn are those whose prefill starts in it:
        a class arriving at once has its vision tower work spread over turns, beside the running decodes, instead
        of all of it in one long turn that stalls every stream."""
        room = self._prefill_budget() - sum(len(t.started.prompt.ids) - t.started.prefilled for t in self._prefilling)
        started: list[Ticket] = []
        while room > 0:
            with self._cond:
                if not self._waiting or self.running + len(started) >= self.max_active:
                    break
                ticket = self._waiting.popleft()
            if ticket.cancelled:
                ticket.stats.finish_reason = "cancelled"
                self._outbox.put((ticket, [], False, True, None))
                continue
            began = time.perf_counter()
            try:
                generation = self.backend.start(
                    ticket.request, ticket.stats, image_hash=ticket.image_hash, prior_hash=ticket.prior_hash
                )
            except BaseException as exc:  # a bad request, or no slot: this answer fails, the others go on
                self._outbox.put((ticket, [], False, True, exc))
                continue
            finally:
                self._profile["start_s"] += time.perf_counter() - began
            generation.defer_text = True
            ticket._admit(generation)
            started.append(ticket)
            room -= len(generation.prompt.ids) - generation.prefilled
        if started:
            try:
                self.backend.prepare_images([ticket.started for ticket in started])
            except Exception as exc:
                logger.error("vision batch failed: %s: %s", type(exc).__name__, one_line(exc))
                for ticket in started:
                    self._end(ticket, exc)
                return
            self._prefilling.extend(started)

    def _drop_cancelled(self) -> None:
        for group in (self._prefilling, self._active):
            for ticket in [t for t in group if t.cancelled]:
                group.remove(ticket)
                self._end(ticket, None)

    def _emit(self, ticket: Ticket) -> None:
        """Hand the new token ids to the output thread; free the KV state (here, on the loop) once done."""
        generation = ticket.started
        ids, flush = self.backend.take_unsent(generation)
        if generation.done:
            self.backend.finish(generation)
        if ids or flush or generation.done:
            self._outbox.put((ticket, ids, flush, generation.done, None))

    def _end(self, ticket: Ticket, error: BaseException | None) -> None:
        ids: list[int] = []
        flush = False
        try:
            if ticket.generation is not None:
                ids, flush = self.backend.take_unsent(ticket.generation)
                self.backend.finish(ticket.generation, cancelled=True)
        except Exception as exc:  # freeing state on a failed backend may fail too; the answer still ends
            logger.warning("could not release an answer's state: %s", one_line(exc))
        self._outbox.put((ticket, ids if error is None else [], flush and error is None, True, error))

    def _fail_all(self, exc: BaseException) -> None:
        for ticket in [*self._prefilling, *self._active]:
            self._end(ticket, exc)
        self._prefilling, self._active, self._in_flight = [], [], []


def _prompt_error(exc: BaseException) -> RequestError:
    """A prompt's own prefill failure, as the user's to fix (never counted against the backend)."""
    error = (
        exc
        if isinstance(exc, RequestError)
        else RequestError(
            f"this question could not be processed ({type(exc).__name__}: {one_line(exc)}); rephrase it without "
            "special markers or start a new case"
        )
    )
    return error
