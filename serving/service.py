"""The running model: which backend serves, hot switching, the TensorRT circuit breaker, and metrics.

Handlers never hold a backend across a switch: each request leases the current backend for its duration.
A switch loads and warms the target first, then swaps the reference under a lock held for microseconds;
requests already running finish on the old backend, which is closed once they drain.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from inference_api.contract import BackendInfo, GenerationRequest, GenerationStats, InferenceBackend
from serving.breaker import CircuitBreaker
from serving.factory import create_backend
from serving.metrics import ServiceMetrics, gpu_memory_snapshot
from serving.settings import Settings

logger = logging.getLogger(__name__)

MODE_LABELS = {"pytorch": "PyTorch", "trt": "TensorRT"}


class SwitchError(RuntimeError):
    """The target backend could not be loaded; the current mode is unchanged."""


class ServiceUnavailable(RuntimeError):
    """No backend can take the request right now (starting or shutting down); the user should retry."""


class InjectedFault(RuntimeError):
    """Raised on the TensorRT path by the test-only fault switch."""


@dataclass(frozen=True)
class SwitchRecord:
    source: str
    target: str
    at: float  # time.time()
    load_s: float  # loading and warming the target (requests kept flowing meanwhile)
    swap_s: float  # how long new requests were held out by the swap
    max_wait_s: float  # longest any request waited for a backend while the switch ran
    reason: str

    @property
    def interruption_s(self) -> float:
        return max(self.swap_s, self.max_wait_s)


class InferenceService:
    def __init__(
        self,
        settings: Settings,
        backend_factory: Callable[[str, Settings], InferenceBackend] = create_backend,
    ) -> None:
        self.settings = settings
        self._factory = backend_factory
        self.metrics = ServiceMetrics()
        self.breaker = CircuitBreaker(settings.breaker_failures)
        self._swap_lock = threading.Lock()  # guards _current/_mode; held only to read or swap the reference
        self._switch_lock = threading.Lock()  # one switch at a time
        self._drained = threading.Condition()
        self._in_flight: dict[int, int] = {}
        self._current: InferenceBackend | None = None
        self._mode: str | None = None
        self._standby: dict[str, InferenceBackend] = {}
        self._switch_started: float | None = None
        self._switch_max_wait = 0.0
        self._waiting = 0
        self._fault_remaining = 0
        self._draining = False
        self.started_at = time.time()
        self.last_switch: SwitchRecord | None = None
        self.trt_state = "Not loaded"
        self.ready = threading.Event()

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Load and warm the configured backend. Raises if it cannot load (the start script shows why)."""
        mode = self.settings.inference_mode
        backend = self._load(mode)
        with self._swap_lock:
            self._current, self._mode = backend, mode
        self.ready.set()
        self.metrics.ready.set(1)

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting requests and wait for running ones. True if all finished within the timeout."""
        self._draining = True
        self.ready.clear()
        self.metrics.ready.set(0)
        with self._drained:
            return self._drained.wait_for(lambda: not any(self._in_flight.values()) and self._waiting == 0, timeout_s)

    def close(self) -> None:
        self.ready.clear()
        self.metrics.ready.set(0)
        with self._swap_lock:
            backends = [self._current, *self._standby.values()]
            self._current, self._standby = None, {}
        for backend in backends:
            if backend is not None:
                backend.close()

    @property
    def mode(self) -> str | None:
        return self._mode

    def info(self) -> BackendInfo | None:
        backend = self._current
        return backend.info() if backend is not None else None

    # --- serving -------------------------------------------------------------------------------------------------
    @contextmanager
    def _lease(self) -> Iterator[tuple[InferenceBackend, str]]:
        if self._draining:
            raise ServiceUnavailable("The server is shutting down; try again in a minute.")
        asked = time.perf_counter()
        with self._drained:
            self._waiting += 1
        self.metrics.queue_depth.inc()
        try:
            with self._swap_lock:
                backend, mode = self._current, self._mode
                if backend is None or mode is None:
                    raise ServiceUnavailable("The model is not loaded yet; try again in a moment.")
                self._in_flight[id(backend)] = self._in_flight.get(id(backend), 0) + 1
            waited = time.perf_counter() - asked
            if self._switch_started is not None:
                self._switch_max_wait = max(self._switch_max_wait, waited)
            yield backend, mode
        finally:
            with self._drained:
                self._waiting -= 1
                if "backend" in locals():
                    self._in_flight[id(backend)] -= 1
                self._drained.notify_all()
            self.metrics.queue_depth.dec()

    def stream_answer(self, request: GenerationRequest) -> Iterator[str]:
        """Yield the answer so far (cumulative text). A TensorRT failure restarts the answer on PyTorch."""
        started = time.perf_counter()
        stats = GenerationStats()
        with self._lease() as (backend, mode):
            if mode != "trt":
                yield from self._stream_on(backend, request, stats)
                self._observe(mode, started, stats)
                return
            try:
                yield from self._stream_on_trt(backend, request, stats)
            except ValueError:  # the request itself is wrong (too long, empty): not a TensorRT failure
                raise
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                logger.error("TensorRT path failed (%s); answering this request on PyTorch", reason)
                self.metrics.errors.labels("tensorrt").inc()
                if self.breaker.record_failure(reason):
                    self._trip(reason)
                fallback = self._pytorch_fallback()
                stats = GenerationStats()
                yield from self._stream_on(fallback, request, stats)
                self._observe("pytorch", started, stats)
                return
        elapsed = time.perf_counter() - started
        if elapsed > self.settings.breaker_timeout_s:
            reason = f"timeout: answer took {elapsed:.1f} s (limit {self.settings.breaker_timeout_s:g} s)"
            self.metrics.errors.labels("tensorrt_timeout").inc()
            if self.breaker.record_failure(reason):
                self._trip(reason)
        else:
            self.breaker.record_success()
        self._observe("trt", started, stats)

    def _stream_on(
        self, backend: InferenceBackend, request: GenerationRequest, stats: GenerationStats
    ) -> Iterator[str]:
        text = ""
        for delta in backend.stream_generate(request, stats):
            text += delta
            yield text

    def _stream_on_trt(self, backend: InferenceBackend, request, stats) -> Iterator[str]:
        if self._take_fault():
            raise InjectedFault("injected TensorRT fault (test switch)")
        yield from self._stream_on(backend, request, stats)

    def _observe(self, mode: str, started: float, stats: GenerationStats) -> None:
        self.metrics.observe_request(mode, time.perf_counter() - started, stats.first_token_s, stats.new_tokens)

    def image_features(self, images):
        with self._lease() as (backend, _mode):
            return backend.image_features(images)

    # --- switching ------------------------------------------------------------------------------------------------
    def switch_to(self, target: str, reason: str = "operator request") -> SwitchRecord:
        """Hot-switch to `target` ("pytorch" or "trt"). Raises SwitchError and changes nothing if it cannot load."""
        if target not in MODE_LABELS:
            raise ValueError(f"unknown mode {target!r}; valid modes: {', '.join(MODE_LABELS)}")
        with self._switch_lock:
            source = self._mode
            if target == source:
                if target == "trt":
                    self.breaker.reset()
                logger.warning("switch to %s requested, but %s is already serving", target, MODE_LABELS[target])
                return SwitchRecord(source or "", target, time.time(), 0.0, 0.0, 0.0, "already in this mode")
            load_started = time.perf_counter()
            # Waits are measured over the whole switch, load included: requests must flow while the target loads.
            self._switch_started, self._switch_max_wait = load_started, 0.0
            target_backend = self._standby.pop(target, None)
            if target_backend is None:
                try:
                    target_backend = self._load(target)
                except Exception as exc:
                    self._switch_started = None
                    self.metrics.errors.labels("switch").inc()
                    raise SwitchError(f"cannot switch to {MODE_LABELS[target]}: {exc}") from exc
            load_s = time.perf_counter() - load_started
            swap_started = time.perf_counter()
            with self._swap_lock:
                old_backend, self._current, self._mode = self._current, target_backend, target
            swap_s = time.perf_counter() - swap_started
            if target == "trt":
                self.breaker.reset()
            self._retire(source, old_backend)
            record = SwitchRecord(source or "", target, time.time(), load_s, swap_s, self._switch_max_wait, reason)
            self._switch_started = None
            self.last_switch = record
            self.metrics.switches.labels(target).inc()
            self.metrics.switch_interruption.set(record.interruption_s)
            logger.info(
                "switched %s -> %s (%s): load %.2f s, interruption %.2f ms",
                MODE_LABELS.get(source or "", source), MODE_LABELS[target], reason, load_s, record.interruption_s * 1e3,
            )  # fmt: skip
            return record

    def _retire(self, mode: str | None, backend: InferenceBackend | None) -> None:
        """Keep PyTorch as the breaker's fallback; close TensorRT unless configured to keep both."""
        if backend is None or mode is None:
            return
        if mode == "pytorch" or self.settings.keep_both_backends:
            self._standby[mode] = backend
            return
        threading.Thread(target=self._close_when_drained, args=(backend,), daemon=True).start()
        if mode == "trt":
            self.trt_state = "Not loaded"

    def _close_when_drained(self, backend: InferenceBackend) -> None:
        with self._drained:
            self._drained.wait_for(lambda: self._in_flight.get(id(backend), 0) == 0)
            self._in_flight.pop(id(backend), None)
        backend.close()

    def _load(self, mode: str) -> InferenceBackend:
        started = time.perf_counter()
        try:
            backend = self._factory(mode, self.settings)
            backend.warm_up()
        except Exception as exc:
            if mode == "trt":
                self.trt_state = f"Failed ({_one_line(exc)})"
            logger.error("could not load the %s backend: %s", MODE_LABELS[mode], _one_line(exc))
            raise
        if mode == "trt":
            self.trt_state = f"Loaded ({backend.info().precision.upper()})"
        logger.info("%s backend ready in %.2f s", MODE_LABELS[mode], time.perf_counter() - started)
        return backend

    def _pytorch_fallback(self) -> InferenceBackend:
        backend = self._standby.get("pytorch")
        if backend is None:
            with self._switch_lock:
                backend = self._standby.get("pytorch")
                if backend is None:
                    backend = self._standby["pytorch"] = self._load("pytorch")
        return backend

    def _trip(self, reason: str) -> None:
        self.metrics.breaker_trips.inc()
        logger.error(
            "circuit breaker tripped after %d consecutive TensorRT failures (last: %s); falling back to PyTorch",
            self.breaker.threshold, reason,
        )  # fmt: skip
        self._pytorch_fallback()
        threading.Thread(
            target=self._switch_quietly, args=("pytorch", f"circuit breaker: {reason}"), daemon=True
        ).start()

    def _switch_quietly(self, target: str, reason: str) -> None:
        try:
            self.switch_to(target, reason)
        except Exception:
            logger.exception("automatic fallback switch to %s failed", target)

    # --- test-only fault switch -------------------------------------------------------------------------------------
    def inject_faults(self, count: int) -> None:
        if not self.settings.fault_injection:
            raise PermissionError("fault injection is disabled (set FAULT_INJECTION=1 in tests only)")
        self._fault_remaining = max(0, int(count))

    def _take_fault(self) -> bool:
        if self._fault_remaining > 0:
            self._fault_remaining -= 1
            return True
        return False

    # --- status ----------------------------------------------------------------------------------------------------
    def status(self) -> dict:
        info = self.info()
        breaker = self.breaker.snapshot()
        return {
            "ready": self.ready.is_set(),
            "url": f"http://{self.settings.host}:{self.settings.port}",
            "mode": self._mode,
            "mode_label": MODE_LABELS.get(self._mode or "", "none"),
            "trt_engine": self.trt_state,
            "backend": asdict(info) if info else None,
            "standby": sorted(self._standby),
            "uptime_s": time.time() - self.started_at,
            "last_switch": {**asdict(self.last_switch), "interruption_s": self.last_switch.interruption_s}
            if self.last_switch
            else None,
            "breaker": asdict(breaker),
            "requests": self.metrics.totals(),
            "latency": self.metrics.latency_percentiles(),
            "queue_depth": self._waiting,
            "gpus": gpu_memory_snapshot(),
        }


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
