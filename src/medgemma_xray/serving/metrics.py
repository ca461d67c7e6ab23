"""Prometheus series for the server, on a registry of its own (one per service, so tests stay independent).

Two sets of names: the project's own (medgemma_*), which existing dashboards use, and vLLM's (vllm:*, with a
model_name label), so dashboards built for vLLM chart this server unchanged: time to first token, inter-token
latency, end-to-end latency, requests running and waiting, KV-cache usage, prefix-cache and multi-modal (image)
cache queries and hits. Cache counters are read from the serving backend at scrape time.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8)
# vLLM's own bucket edges for these histograms (vllm/v1/metrics/loggers.py).
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
VLLM_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


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
            "1 for what serves: the mode (pytorch, engine-bundle), the executor that runs it (TensorRT only where "
            "TensorRT executes), its precision, whether its accuracy was measured on that executor, and whether its "
            "accuracy gate passed any threshold lowered below the default",
            ["mode", "executor", "precision", "accuracy_verified", "thresholds_lowered"],
            registry=self.registry,
        )
        self.gate_value = Gauge(
            "medgemma_engine_gate_value",
            "The serving bundle's accuracy-gate figures against PyTorch (figure: token_agreement, "
            "long_token_agreement, long_top1_agreement, long_kl, ...)",
            ["figure"],
            registry=self.registry,
        )
        self.gate_threshold = Gauge(
            "medgemma_engine_gate_threshold",
            "The threshold each gate figure passed; lowered=true where the build loosened it below the default",
            ["figure", "bound", "lowered"],
            registry=self.registry,
        )
        self.gate_default = Gauge(
            "medgemma_engine_gate_default_threshold",
            "The default threshold of each gate figure",
            ["figure", "bound"],
            registry=self.registry,
        )
        # vLLM's names (model_name: "pytorch", or the engine bundle's executor and precision, onnxruntime-cpu-int8).
        self.vllm_ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            ["model_name"],
            buckets=VLLM_TTFT_BUCKETS,
            registry=self.registry,
        )
        self.vllm_itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ["model_name"],
            buckets=VLLM_ITL_BUCKETS,
            registry=self.registry,
        )
        self.vllm_e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            ["model_name"],
            buckets=VLLM_E2E_BUCKETS,
            registry=self.registry,
        )
        self.vllm_waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", registry=self.registry
        )
        self.vllm_running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", registry=self.registry
        )
        self._cache_stats = None
        self.registry.register(_CacheCollector(self))
        self._latencies: deque[float] = deque(maxlen=2000)
        self._lock = threading.Lock()
        _register_gpu_collector(self.registry)

    def bind_queue(self, waiting, running) -> None:
        """Read both queue gauges from the service at scrape time (callables returning counts)."""
        self.requests_waiting.set_function(waiting)
        self.requests_running.set_function(running)
        self.vllm_waiting.set_function(waiting)
        self.vllm_running.set_function(running)

    def set_backend(self, info) -> None:
        """One series, for the backend that serves now (a BackendInfo); the previous one is removed. An engine
        bundle's gate figures and thresholds come with it (none for PyTorch)."""
        from medgemma_xray.engine_bundle.gate import gate_figures

        for gauge in (self.backend, self.gate_value, self.gate_threshold, self.gate_default):
            gauge.clear()
        verified = "false" if info.unverified_reason else "true"
        figures = gate_figures((info.details or {}).get("accuracy"))
        lowered = "true" if any(figure.lowered for figure in figures) else "false"
        mode = "pytorch" if str(info.mode) == "pytorch" else "engine-bundle"
        self.backend.labels(mode, info.executor, info.precision, verified, lowered).set(1)
        for figure in figures:
            bound = "min" if figure.at_least else "max"
            if figure.value is not None:
                self.gate_value.labels(figure.key).set(figure.value)
            if figure.threshold is not None:
                self.gate_threshold.labels(figure.key, bound, str(figure.lowered).lower()).set(figure.threshold)
            self.gate_default.labels(figure.key, bound).set(figure.default)

    def bind_cache_stats(self, cache_stats) -> None:
        """A callable returning the serving backend's InferenceBackend.cache_stats() (or None), read at scrape."""
        self._cache_stats = cache_stats

    def observe_request(
        self, mode: str, seconds: float, first_token_s: float | None, tokens: int, token_times=()
    ) -> None:
        """token_times: perf_counter() of each generated token; their gaps are the inter-token latencies."""
        mode = str(mode)
        self.request_latency.labels(mode).observe(seconds)
        self.vllm_e2e.labels(mode).observe(seconds)
        if first_token_s is not None:
            self.time_to_first_token.labels(mode).observe(first_token_s)
            self.vllm_ttft.labels(mode).observe(first_token_s)
        itl = self.vllm_itl.labels(mode)
        for earlier, later in zip(token_times, list(token_times)[1:], strict=False):
            itl.observe(later - earlier)
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


class _CacheCollector:
    """vLLM's cache series, read from the backend at scrape time (counters live in the backend's caches)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        reader = self.metrics._cache_stats
        try:
            stats = reader() if reader is not None else None
        except Exception as exc:  # a backend mid-switch: no cache series this scrape, never a failed scrape
            logger.debug("cache stats unavailable: %s", exc)
            stats = None
        if not stats:
            return
        usage = stats.get("kv_cache_usage")
        if usage is not None:
            yield GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
            yield GaugeMetricFamily("medgemma_kv_cache_usage_ratio", "KV slots in use (0..1)", usage)
        for prefix, key, what in (("prefix_cache", "prefix_cache", "tokens"), ("mm_cache", "mm_cache", "images")):
            figures = stats.get(key) or {}
            for field in ("queries", "hits"):
                yield CounterMetricFamily(
                    f"vllm:{prefix}_{field}", f"{prefix.replace('_', ' ')} {field}, in {what}.", figures.get(field, 0)
                )
        mm = stats.get("mm_cache") or {}
        yield CounterMetricFamily(
            "medgemma_vision_encoder_calls", "Films run through the vision tower", mm.get("encoder_calls", 0)
        )


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
