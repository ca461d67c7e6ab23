"""Arithmetic of the single-stream benchmark, kept apart from the GPU so CI checks it: the TTFT split
into its five parts, and the gaps in a kernel timeline.

TTFT parts (milliseconds, each median of its own runs):
- preprocessing: the processor's resize/normalise on the CPU and the copy to the GPU (0 when the pixel cache holds
  the film: preprocessed when it arrived);
- vision tower: the film's features;
- prefill: the prompt up to the first token sampled;
- first decode: the step after it (the second token's wait; not part of the first token's time);
- the service's own overhead: the service's time to the first token (submit -> token accepted) minus the three
  parts above it, which holds the contract's encoding and bookkeeping and the scheduler's hand-off.
"""

from __future__ import annotations

from collections.abc import Iterable


def ttft_breakdown(
    preprocess_ms: float,
    vision_ms: float,
    prefill_ms: float,
    first_decode_ms: float,
    contract_ms: float,
    service_ms: float,
) -> dict[str, float]:
    """The five parts and the totals. contract_ms: start -> first token at the backend contract; service_ms: the
    same through the scheduler (the real ask path). Overheads are what the totals hold beyond the measured parts;
    they come out negative only when the parts were timed slower alone than inside the whole (noise): then the
    figure says so rather than hiding it."""
    model = preprocess_ms + vision_ms + prefill_ms
    return {
        "preprocess_ms": preprocess_ms,
        "vision_ms": vision_ms,
        "prefill_ms": prefill_ms,
        "first_decode_ms": first_decode_ms,
        "contract_overhead_ms": contract_ms - model,
        "scheduler_overhead_ms": service_ms - contract_ms,
        "service_overhead_ms": service_ms - model,
        "ttft_contract_ms": contract_ms,
        "ttft_service_ms": service_ms,
    }


def timeline_gaps(kernels: Iterable[tuple[float, float]], host_gap_us: float = 10.0) -> dict[str, float]:
    """Idle time in a kernel timeline of (start_us, duration_us) pairs, in any order, overlaps allowed.

    Inside a captured step the GPU's own launch latency leaves gaps of a few microseconds between kernels; a gap of
    host_gap_us or more is the GPU waiting for the host (between steps, or a host sync). Returns the span (first
    start to last end), busy time (union of the kernels), and both kinds of idle time and their fractions of the
    span."""
    ordered = sorted((float(start), float(start) + float(duration)) for start, duration in kernels)
    if not ordered:
        raise ValueError("the timeline holds no kernels: was the profiler's CUDA activity recorded?")
    busy, host_idle, device_idle, gaps = 0.0, 0.0, 0.0, 0
    current_start, current_end = ordered[0]
    for start, end in ordered[1:]:
        if start <= current_end:
            current_end = max(current_end, end)
            continue
        busy += current_end - current_start
        gap = start - current_end
        if gap >= host_gap_us:
            host_idle += gap
            gaps += 1
        else:
            device_idle += gap
        current_start, current_end = start, end
    busy += current_end - current_start
    span = max(end for _, end in ordered) - ordered[0][0]
    return {
        "kernels": len(ordered),
        "span_us": span,
        "busy_us": busy,
        "host_gap_us": host_idle,
        "host_gaps": gaps,
        "launch_gap_us": device_idle,
        "host_gap_fraction": host_idle / span if span else 0.0,
        "idle_fraction": (host_idle + device_idle) / span if span else 0.0,
    }
