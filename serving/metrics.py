"""Prometheus series for the server, on a registry of its own (one per service, so tests stay independent)."""

from __future__ import annotations

import logging
import threading
from collections import deque

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8)


class ServiceMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.request_latency = Histogram(
            "medgemma_request_latency_seconds",
            "Whole-answer latency",
            ["mode"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            "medgemma_time_to_first_token_seconds",
            "Time to the first generated token",
            ["mode"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter("medgemma_generated_tokens", "Tokens generated", ["mode"], registry=self.registry)
        self.requests = Counter("medgemma_requests", "Answered requests", ["mode"], registry=self.registry)
        self.errors = Counter("medgemma_errors", "Failed requests or attempts", ["kind"], registry=self.registry)
        self.switches = Counter("medgemma_switches", "Backend switches", ["target"], registry=self.registry)
        self.breaker_trips = Counter("medgemma_breaker_trips", "Circuit-breaker trips", registry=self.registry)
        self.requests_waiting = Gauge(
            "medgemma_requests_waiting", "Answers queued for a decode slot", registry=self.registry
        )
        self.requests_running = Gauge(
            "medgemma_requests_running", "Answers being prefilled or decoded", registry=self.registry
        )
        self.switch_interruption = Gauge(
            "medgemma_switch_interruption_seconds", "Longest wait caused by the last switch", registry=self.registry
        )
        self.ready = Gauge("medgemma_ready", "1 when a warmed-up backend serves", registry=self.registry)
        self.backend = Gauge(
            "medgemma_backend_info",
            "1 for what serves: the mode, the executor that runs it (TensorRT only where TensorRT executes), "
            "its precision, and whether its accuracy was measured on that executor",
            ["mode", "executor", "precision", "accuracy_verified"],
            registry=self.registry,
        )
        self._latencies: deque[float] = deque(maxlen=2000)
        self._lock = threading.Lock()
        _register_gpu_collector(self.registry)

    def bind_queue(self, waiting, running) -> None:
        """Read both queue gauges from the service at scrape time (callables returning counts)."""
        self.requests_waiting.set_function(waiting)
        self.requests_running.set_function(running)

    def set_backend(self, info) -> None:
        """One series, for the backend that serves now (a BackendInfo); the previous one is removed."""
        self.backend.clear()
        verified = "false" if info.unverified_reason else "true"
        self.backend.labels(str(info.mode), info.executor, info.precision, verified).set(1)

    def observe_request(self, mode: str, seconds: float, first_token_s: float | None, tokens: int) -> None:
        mode = str(mode)
        self.request_latency.labels(mode).observe(seconds)
        if first_token_s is not None:
            self.time_to_first_token.labels(mode).observe(first_token_s)
        self.tokens.labels(mode).inc(tokens)
        self.requests.labels(mode).inc()
        with self._lock:
            self._latencies.append(seconds)

    def latency_percentiles(self) -> dict[str, float | None]:
        with self._lock:
            values = sorted(self._latencies)
        if not values:
            return {"p50_s": None, "p99_s": None}

        def pick(q: float) -> float:
            return values[min(len(values) - 1, int(q * len(values)))]

        return {"p50_s": pick(0.50), "p99_s": pick(0.99)}

    def totals(self) -> dict[str, float]:
        def total(metric_name: str) -> float:
            return sum(
                sample.value
                for metric in self.registry.collect()
                for sample in metric.samples
                if sample.name == metric_name
            )

        return {"requests": total("medgemma_requests_total"), "errors": total("medgemma_errors_total")}

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def gpu_memory_snapshot() -> list[dict]:
    """Per-GPU memory and utilisation through NVML; empty where there is no NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: a CPU host
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            utilisation = pynvml.nvmlDeviceGetUtilizationRates(handle)
            gpus.append(
                {
                    "index": index,
                    "used_bytes": memory.used,
                    "total_bytes": memory.total,
                    "util_percent": utilisation.gpu,
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _register_gpu_collector(registry) -> None:
    from prometheus_client.core import GaugeMetricFamily

    class GpuCollector:
        def collect(self):
            gpus = gpu_memory_snapshot()
            used = GaugeMetricFamily("medgemma_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"])
            util = GaugeMetricFamily("medgemma_gpu_utilization_percent", "GPU utilisation", labels=["gpu"])
            for gpu in gpus:
                used.add_metric([str(gpu["index"])], gpu["used_bytes"])
                util.add_metric([str(gpu["index"])], gpu["util_percent"])
            yield used
            yield util

    registry.register(GpuCollector())
