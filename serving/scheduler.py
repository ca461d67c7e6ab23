"""Iteration-level batching: one thread drives every answer of one backend through the token-level contract.

Each loop turn: drop cancelled answers, admit waiting ones (their films go through the vision tower as one batch),
prefill one of them by at most a chunk (so running streams stall for one chunk, not a whole prompt), then decode
one token for every running answer in a single batched call. An answer joins the batch at the next turn after its
prefill and leaves it when it stops; a closed browser tab frees its slot at the next turn.

Why not transformers' continuous-batching manager: in 5.17 it takes token ids only (no images), and it drops its
fast paths on sliding-window models such as Gemma 3. The contract's backends bring their own KV layouts (a
DynamicCache, a static slot cache, an engine's buffers), so the scheduler only orders calls.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator

from inference_api.contract import Generation, InferenceBackend
from inference_api.errors import one_line
from inference_api.types import GenerationRequest, GenerationStats

logger = logging.getLogger(__name__)

PREFILL_CHUNK_WHILE_DECODING = 512  # tokens of a new prompt per turn while other answers stream


class SchedulerBusyError(RuntimeError):
    """The waiting queue is full: the user should retry in a minute."""


class SchedulerClosedError(RuntimeError):
    """The scheduler no longer admits work (its backend was switched out or the server is stopping)."""


class AnswerTimeoutError(TimeoutError):
    """No progress within the deadline: a hung or overloaded backend."""


class Ticket:
    """One answer's place in the scheduler. The handler thread reads its text deltas as they are produced."""

    def __init__(self, request: GenerationRequest, stats: GenerationStats) -> None:
        self.request, self.stats = request, stats
        self.submitted_at = time.perf_counter()
        self.admitted_at: float | None = None  # when the backend started on it (queue wait excluded)
        self.finished_at: float | None = None
        self.generation: Generation | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._admitted = threading.Event()

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

    def __init__(self, backend: InferenceBackend, max_active: int, max_waiting: int, name: str = "scheduler") -> None:
        self.backend = backend
        self.max_active = max(1, int(max_active))
        self.max_waiting = max(1, int(max_waiting))
        self._waiting: deque[Ticket] = deque()
        self._prefilling: list[Ticket] = []
        self._active: list[Ticket] = []
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # --- any thread ---------------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, stats: GenerationStats | None = None) -> Ticket:
        ticket = Ticket(request, stats if stats is not None else GenerationStats())
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
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # --- the loop thread --------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._prefilling or self._active or self._closing):
                    self._cond.wait()
                if self._closing and not (self._waiting or self._prefilling or self._active):
                    return
            try:
                self._turn()
            except BaseException as exc:  # a backend failure ends every answer it touched, and the loop goes on
                logger.error("backend call failed: %s: %s", type(exc).__name__, one_line(exc))
                self._fail_all(exc)

    def _turn(self) -> None:
        self._drop_cancelled()
        self._admit_waiting()
        if self._prefilling:
            ticket = self._prefilling[0]
            budget = PREFILL_CHUNK_WHILE_DECODING if self._active else None
            try:
                done = self.backend.prefill(ticket.generation, budget)
            except Exception as exc:  # this answer fails; the running ones go on
                logger.error("prefill failed: %s: %s", type(exc).__name__, one_line(exc))
                self._prefilling.pop(0)
                self._end(ticket, exc)
                done = False
            else:
                if done:
                    self._prefilling.pop(0)
            if done:
                self._emit(ticket)
                if not ticket.generation.done:
                    self._active.append(ticket)
        if self._active:
            self.backend.step([ticket.generation for ticket in self._active])
            still = []
            for ticket in self._active:
                self._emit(ticket)
                if not ticket.generation.done:
                    still.append(ticket)
            self._active = still

    def _admit_waiting(self) -> None:
        admitted = []
        with self._cond:
            while self._waiting and self.running + len(admitted) < self.max_active:
                admitted.append(self._waiting.popleft())
        started = []
        for ticket in admitted:
            if ticket.cancelled:
                ticket.stats.finish_reason = "cancelled"
                ticket._end()
                continue
            try:
                ticket._admit(self.backend.start(ticket.request, ticket.stats))
            except BaseException as exc:  # a bad request, or no slot: this answer fails, the others go on
                ticket._end(exc)
                continue
            started.append(ticket)
        if started:
            try:
                self.backend.prepare_images([ticket.generation for ticket in started])
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
        generation = ticket.generation
        ticket._text(generation.new_text)
        if generation.done:
            self.backend.finish(generation)
            ticket._end()

    def _end(self, ticket: Ticket, error: BaseException | None) -> None:
        try:
            if ticket.generation is not None:
                self.backend.finish(ticket.generation, cancelled=True)
        except Exception as exc:  # freeing state on a failed backend may fail too; the answer still ends
            logger.warning("could not release an answer's state: %s", one_line(exc))
        ticket._end(error)

    def _fail_all(self, exc: BaseException) -> None:
        for ticket in [*self._prefilling, *self._active]:
            self._end(ticket, exc)
        self._prefilling, self._active = [], []
