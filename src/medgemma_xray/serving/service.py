"""The running model: which backend serves, hot switching, the TensorRT circuit breaker, and metrics.

One state object, guarded by one condition variable: the current backend, the standby ones, and a lease count on
each. A request leases a backend for its whole answer, so handlers never hold one across a switch. A switch loads
and warms the target first while requests keep flowing, then swaps the reference under the condition; answers
already running finish on the old backend, which is closed once its leases drain (or kept as a standby).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from medgemma_xray.inference_api.contract import InferenceBackend
from medgemma_xray.inference_api.errors import RequestError, one_line
from medgemma_xray.inference_api.types import BackendInfo, GenerationRequest, GenerationStats, Mode
from medgemma_xray.serving.breaker import CircuitBreaker
from medgemma_xray.serving.factory import create_backend
from medgemma_xray.serving.metrics import ServiceMetrics, gpu_memory_snapshot
from medgemma_xray.serving.scheduler import AnswerTimeoutError, Scheduler, SchedulerBusyError, SchedulerClosedError
from medgemma_xray.serving.settings import Settings

logger = logging.getLogger(__name__)


class SwitchError(RuntimeError):
    """The target backend could not be loaded; the current mode is unchanged."""


class ServiceUnavailable(RuntimeError):
    """No backend can take the request right now (starting, shutting down, or busy); the user should retry."""


@dataclass(frozen=True)
class SwitchRecord:
    source: str
    target: str
    at: float  # time.time()
    load_s: float  # loading and warming the target (requests kept flowing meanwhile)
    swap_s: float  # how long the reference swap held the state lock
    max_wait_s: float  # longest any request waited for a backend while the switch ran
    reason: str
    source_label: str = ""  # what served and serves, in words (BackendInfo.mode_label: names the executor)
    target_label: str = ""

    @property
    def interruption_s(self) -> float:
        return max(self.swap_s, self.max_wait_s)


class Served:
    """A loaded backend, the scheduler that drives it, and how many requests hold it."""

    def __init__(self, mode: Mode, backend: InferenceBackend, scheduler: Scheduler) -> None:
        self.mode, self.backend, self.scheduler = mode, backend, scheduler
        self.metric_label = backend.info().metric_label  # what metric series call it: pytorch, onnxruntime-cpu-int8
        self.leases = 0
        self.retired = False

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the scheduler (a hung backend call cannot hold this forever), then release the model."""
        if not self.scheduler.close(timeout_s):
            logger.warning(
                "the %s scheduler did not stop within %.0f s; closing its backend anyway", self.mode, timeout_s
            )
        self.backend.close()
        # A closed backend's weights and arenas are freed, but glibc keeps them in its heaps (the one-hour soak's
        # RSS rose in steps at each switch): hand them back so MemoryMax sees what is really in use.
        from medgemma_xray.serving.memory import return_freed_memory

        return_freed_memory()


class InferenceService:
    def __init__(
        self,
        settings: Settings,
        backend_factory: Callable[[Mode, Settings], InferenceBackend] = create_backend,
    ) -> None:
        self.settings = settings
        self._factory = backend_factory
        self.metrics = ServiceMetrics()
        self.breaker = CircuitBreaker(settings.breaker_failures)
        self._state = threading.Condition()  # guards every field below, up to the switch lock
        self._current: Served | None = None
        self._standby: dict[Mode, Served] = {}
        self._draining = False
        self._switch_started: float | None = None
        self._switch_max_wait = 0.0
        self._closed = False
        self._trt_state = "Not loaded"
        self._workers: set[threading.Thread] = set()  # owned here: joined by close()
        self._switch_lock = threading.Lock()  # one load at a time: switches and the breaker's fallback
        self.started_at = time.time()
        self.last_switch: SwitchRecord | None = None
        self.ready = threading.Event()
        self.metrics.bind_queue(self._count_waiting, self._count_running)
        self.metrics.bind_cache_stats(self.cache_stats)

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Load and warm the configured backend. Raises if it cannot load (the start script shows why)."""
        served = self._load(self.settings.inference_mode)
        with self._state:
            self._current = served
        self.metrics.set_backend(served.backend.info())
        self.ready.set()
        self.metrics.ready.set(1)

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting requests and wait for running ones. True if all finished within the timeout."""
        with self._state:
            self._draining = True
            self.ready.clear()
            self.metrics.ready.set(0)
            return self._state.wait_for(lambda: self._total_leases() == 0, timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Close every loaded backend and join the service's own threads. Idempotent.

        A switch or breaker fallback that is loading finishes first (up to timeout_s); one that finishes later
        closes what it loaded itself, since the service no longer accepts it."""
        self.ready.clear()
        self.metrics.ready.set(0)
        got_switch_lock = self._switch_lock.acquire(timeout=timeout_s)
        try:
            with self._state:
                self._draining = True
                self._closed = True
                served = [s for s in (self._current, *self._standby.values()) if s is not None]
                self._current, self._standby = None, {}
                self._state.notify_all()
        finally:
            if got_switch_lock:
                self._switch_lock.release()
        for item in served:
            item.close(timeout_s=5)
        deadline = time.monotonic() + timeout_s
        for worker in self._owned_workers():
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                logger.warning("service thread %s did not finish within %.0f s of close", worker.name, timeout_s)

    @property
    def trt_state(self) -> str:
        with self._state:
            return self._trt_state

    def _set_trt_state(self, text: str) -> None:
        with self._state:
            self._trt_state = text

    def _spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Start a service thread that close() joins (daemon only so that a hung backend cannot block exit)."""

        def run() -> None:
            try:
                target()
            finally:
                with self._state:
                    self._workers.discard(threading.current_thread())

        worker = threading.Thread(target=run, name=name, daemon=True)
        with self._state:
            self._workers.add(worker)
        worker.start()
        return worker

    def _owned_workers(self) -> list[threading.Thread]:
        with self._state:
            return [w for w in self._workers if w is not threading.current_thread()]

    @property
    def mode(self) -> Mode | None:
        current = self._current
        return current.mode if current is not None else None

    def info(self) -> BackendInfo | None:
        current = self._current
        return current.backend.info() if current is not None else None

    # --- serving -------------------------------------------------------------------------------------------------
    @contextmanager
    def _lease(self, mode: Mode | None = None) -> Iterator[Served]:
        """Hold the current backend (or the loaded one of `mode`) for the duration of one answer."""
        asked = time.perf_counter()
        with self._state:
            if self._draining:
                raise ServiceUnavailable("The server is shutting down; try again in a minute.")
            served = self._current if mode is None else self._loaded(mode)
            if served is None:
                raise ServiceUnavailable("The model is not loaded yet; try again in a moment.")
            served.leases += 1
            if self._switch_started is not None:
                self._switch_max_wait = max(self._switch_max_wait, time.perf_counter() - asked)
        try:
            yield served
        finally:
            with self._state:
                served.leases -= 1
                self._state.notify_all()

    def stream_answer(
        self, request: GenerationRequest, stats: GenerationStats | None = None
    ) -> Generator[str, None, None]:
        """Yield the answer so far (cumulative text). A TensorRT failure restarts the answer on PyTorch.

        Raises RequestError (the user's to fix), ServiceUnavailable (retry later) or the backend's error.
        """
        stats = stats if stats is not None else GenerationStats()
        started = time.perf_counter()
        with self._lease() as served:
            if served.mode is not Mode.TRT:
                yield from self._answer_on(served, request, stats, started)
                return
            try:
                yield from self._answer_on(served, request, stats, started, judge=True)
                return
            except (RequestError, ServiceUnavailable):
                raise
            except Exception as exc:
                reason = f"{type(exc).__name__}: {one_line(exc)}"
                logger.error(
                    "%s failed (%s); answering this request on PyTorch", served.backend.info().mode_label, reason
                )
                self.metrics.errors.labels(
                    "tensorrt_timeout" if isinstance(exc, AnswerTimeoutError) else "tensorrt"
                ).inc()
                if self.breaker.record_failure(reason):
                    self._trip(reason)
        fallback_stats = GenerationStats()
        with self._pytorch_lease() as fallback:
            yield from self._answer_on(fallback, request, fallback_stats, time.perf_counter())
        _copy_stats(fallback_stats, stats)

    def _answer_on(self, served: Served, request, stats, started: float, judge: bool = False) -> Iterator[str]:
        settings = self.settings
        try:
            ticket = served.scheduler.submit(request, stats)
        except SchedulerBusyError:
            self.metrics.errors.labels("busy").inc()
            raise ServiceUnavailable("The server is busy with other answers; please retry in a minute.") from None
        except SchedulerClosedError:
            raise ServiceUnavailable("The model was just switched; please ask again.") from None
        progress_timeout = settings.breaker_timeout_s if judge else settings.request_timeout_s
        text, first_token_s = "", None
        try:
            for delta in ticket.deltas(settings.request_timeout_s, progress_timeout):
                if first_token_s is None:
                    first_token_s = time.perf_counter() - started
                text += delta
                yield text
        except AnswerTimeoutError as exc:
            if judge:
                raise  # the breaker's business: a hung or slow engine
            self.metrics.errors.labels("timeout").inc()
            raise ServiceUnavailable(
                f"No answer in time: {exc}. The server is busy; please retry in a minute."
            ) from exc
        finally:
            ticket.cancel()  # a closed tab (GeneratorExit) frees the slot at the scheduler's next turn
        if judge:
            self.breaker.record_success()
        self.metrics.observe_request(
            served.metric_label, time.perf_counter() - started, first_token_s, stats.new_tokens, stats.token_times
        )

    def image_features(self, images):
        with self._lease() as served:
            return served.backend.image_features(images)

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        """serving.surface.InferenceSurface.count_prompt_tokens, on the backend serving now."""
        with self._lease() as served:
            return served.backend.prompt_length(request)

    def forget_conversation(self, conversation_id: str) -> None:
        """Free a conversation's cached KV state on every loaded backend ("new case", a closed session)."""
        with self._state:
            loaded = [s for s in (self._current, *self._standby.values()) if s is not None]
        for served in loaded:
            served.backend.forget(conversation_id)

    def prepare_film(self, image) -> None:
        """Get a film ready for the vision tower as it arrives (upload), before anyone asks about it: a backend
        with a preprocess_film hook (the PyTorch fast path) keeps its resized, normalised pixels by content hash,
        so a question's first token does not wait for them (7-9 ms on the H200 host). Others ignore it.
        A failure here only costs that time later: the answer path preprocesses again and reports any error."""
        with self._state:
            current = self._current
        preprocess = getattr(current.backend, "preprocess_film", None) if current is not None else None
        if preprocess is None:
            return
        try:
            preprocess(image)
        except Exception as exc:
            logger.warning("preparing a film on arrival failed: %s: %s", type(exc).__name__, one_line(exc))

    # --- switching ------------------------------------------------------------------------------------------------
    def switch_to(self, target: Mode | str, reason: str = "operator request") -> SwitchRecord:
        """Hot-switch to `target`. Raises SwitchError and changes nothing if it cannot load."""
        try:
            target = Mode.parse(target)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        with self._switch_lock:
            if self._closed:
                raise SwitchError(f"cannot switch to {target.label}: the service is shutting down")
            source = self.mode
            source_label = _label(self.info(), source)
            if target is source:
                if target is Mode.TRT:
                    self.breaker.reset()
                logger.warning("switch to %s requested, but %s is already serving", target.label, target.label)
                return SwitchRecord(str(source or ""), str(target), time.time(), 0.0, 0.0, 0.0, "already in this mode")
            load_started = time.perf_counter()
            with self._state:  # waits are measured over the whole switch, load included
                self._switch_started, self._switch_max_wait = load_started, 0.0
                served = self._standby.pop(target, None)
            if served is not None:
                served.backend.keep_conversations = True
            try:
                if served is None:
                    try:
                        served = self._load(target)
                    except Exception as exc:
                        self.metrics.errors.labels("switch").inc()
                        raise SwitchError(f"cannot switch to {target.label}: {one_line(exc)}") from exc
                load_s = time.perf_counter() - load_started
                swap_started = time.perf_counter()
                with self._state:
                    closed = self._closed
                    if not closed:
                        old, self._current = self._current, served
                    swap_s = time.perf_counter() - swap_started
                if closed:
                    served.close(timeout_s=5)
                    raise SwitchError(f"cannot switch to {target.label}: the service closed during the switch")
                if target is Mode.TRT:
                    self.breaker.reset()
                self._retire(old)
            finally:
                with self._state:
                    max_wait, self._switch_started = self._switch_max_wait, None
            target_info = served.backend.info()
            record = SwitchRecord(
                str(source or ""),
                str(target),
                time.time(),
                load_s,
                swap_s,
                max_wait,
                reason,
                source_label,
                target_info.mode_label,
            )
            self.last_switch = record
            self.metrics.set_backend(target_info)
            self.metrics.switches.labels(str(target)).inc()
            self.metrics.switch_interruption.set(record.interruption_s)
            logger.info(
                "switched %s -> %s (%s): load %.2f s, interruption %.3f ms",
                source_label,
                record.target_label,
                reason,
                load_s,
                record.interruption_s * 1e3,
            )
            return record

    def _retire(self, served: Served | None) -> None:
        """Keep PyTorch as the breaker's fallback; close TensorRT unless configured to keep both. A standby that
        is replaced is closed, never dropped."""
        if served is None:
            return
        if served.mode is Mode.PYTORCH or self.settings.keep_both_backends:
            # A standby keeps no conversation's KV state: the cache belongs to the backend that serves.
            served.backend.keep_conversations = False
            served.backend.forget_all()
            with self._state:
                replaced = self._standby.get(served.mode)
                self._standby[served.mode] = served
            if replaced is not None:
                self._close_when_drained(replaced)
            return
        if served.mode is Mode.TRT:
            self._set_trt_state("Not loaded")
        self._close_when_drained(served)

    def _close_when_drained(self, served: Served) -> None:
        served.retired = True

        def close() -> None:
            with self._state:
                # close() of the service ends the wait too: its own drain bounds how long leases may run.
                self._state.wait_for(lambda: served.leases == 0 or self._closed)
            served.close()

        self._spawn(f"close-{served.mode}", close)

    def _loaded(self, mode: Mode) -> Served | None:
        """The loaded backend of `mode`, current or standby. Caller holds the state lock."""
        if self._current is not None and self._current.mode is mode:
            return self._current
        return self._standby.get(mode)

    @contextmanager
    def _pytorch_lease(self) -> Iterator[Served]:
        """A lease on PyTorch for the breaker's fallback: the loaded one, or one loaded now (once, whoever asks)."""
        with self._state:
            loaded = self._loaded(Mode.PYTORCH)
        if loaded is None:
            with self._switch_lock:  # a switch in progress finishes first; then PyTorch is usually loaded
                with self._state:
                    loaded = self._loaded(Mode.PYTORCH)
                if loaded is None:
                    if self._closed:
                        raise ServiceUnavailable("The server is shutting down; try again in a minute.")
                    served = self._load(Mode.PYTORCH)
                    with self._state:
                        closed = self._closed
                        if not closed:
                            self._standby[Mode.PYTORCH] = served
                    if closed:
                        served.close(timeout_s=5)
                        raise ServiceUnavailable("The server is shutting down; try again in a minute.")
        with self._lease(Mode.PYTORCH) as served:
            yield served

    def _load(self, mode: Mode) -> Served:
        started = time.perf_counter()
        try:
            backend = self._factory(mode, self.settings)
            try:
                backend.warm_up()
            except BaseException:
                backend.close()
                raise
        except Exception as exc:
            if mode is Mode.TRT:
                self._set_trt_state(f"Failed ({one_line(exc)})")
            logger.error("could not load the %s backend: %s", mode.label, one_line(exc))
            raise
        info = backend.info()
        if mode is Mode.TRT:
            self._set_trt_state(f"Loaded ({info.engine_summary})")
        logger.info("%s backend ready in %.2f s", info.mode_label, time.perf_counter() - started)
        settings = self.settings
        scheduler = Scheduler(
            backend,
            settings.generation_concurrency,
            settings.queue_size,
            name=f"scheduler-{mode}",
            max_batched_tokens=settings.max_batched_tokens,
        )
        return Served(mode, backend, scheduler)

    def _trip(self, reason: str) -> None:
        self.metrics.breaker_trips.inc()
        logger.error(
            "circuit breaker tripped after %d consecutive engine failures (last: %s); falling back to PyTorch",
            self.breaker.threshold,
            reason,
        )
        self._spawn("breaker-fallback", lambda: self._switch_quietly(Mode.PYTORCH, f"circuit breaker: {reason}"))

    def _switch_quietly(self, target: Mode, reason: str) -> None:
        try:
            self.switch_to(target, reason)
        except Exception:
            logger.exception("automatic fallback switch to %s failed", target.label)

    # --- status ----------------------------------------------------------------------------------------------------
    def _total_leases(self) -> int:
        return sum(s.leases for s in (self._current, *self._standby.values()) if s is not None)

    def _schedulers(self) -> list[Scheduler]:
        return [s.scheduler for s in (self._current, *self._standby.values()) if s is not None]

    def cache_stats(self) -> dict | None:
        """The serving backend's shared-cache and KV counters (metrics, benchmark); None while nothing serves."""
        served = self._current
        return served.backend.cache_stats() if served is not None else None

    def _count_waiting(self) -> int:
        return sum(scheduler.waiting for scheduler in self._schedulers())

    def _count_running(self) -> int:
        return sum(scheduler.running for scheduler in self._schedulers())

    def status(self, brief: bool = False) -> dict:
        """serving.surface.InferenceSurface.status: brief=True (the UI badge, every few seconds per open page)
        leaves out the GPU query and the latency figures."""
        info = self.info()
        breaker = self.breaker.snapshot()
        mode = self.mode
        if brief:
            return {
                "ready": self.ready.is_set(),
                "mode": str(mode) if mode else None,
                "mode_label": _label(info, mode),
                "breaker": asdict(breaker),
            }
        with self._state:
            standby = sorted(str(m) for m in self._standby)
            trt_state = self._trt_state
        return {
            "ready": self.ready.is_set(),
            "url": f"http://{self.settings.host}:{self.settings.port}",
            "mode": str(mode) if mode else None,
            "mode_label": _label(info, mode),
            "trt_engine": trt_state,
            "backend": {**asdict(info), "mode": str(info.mode), "capabilities": sorted(info.capabilities)}
            if info
            else None,
            "standby": standby,
            "uptime_s": time.time() - self.started_at,
            "last_switch": {**asdict(self.last_switch), "interruption_s": self.last_switch.interruption_s}
            if self.last_switch
            else None,
            "breaker": asdict(breaker),
            "requests": self.metrics.totals(),
            "latency": self.metrics.latency_percentiles(),
            "requests_waiting": self._count_waiting(),
            "requests_running": self._count_running(),
            "gpus": gpu_memory_snapshot(),
        }


def _copy_stats(source: GenerationStats, target: GenerationStats) -> None:
    for name, value in vars(source).items():
        setattr(target, name, value)


def _label(info: BackendInfo | None, mode: Mode | None) -> str:
    """What serves, in words: the backend's own label (it names the executor), else the mode's."""
    return info.mode_label if info is not None else (mode.label if mode else "none")
