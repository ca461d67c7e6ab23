"""The single-stream benchmark's arithmetic: the TTFT split and the kernel-timeline gaps."""

from __future__ import annotations

import pytest

from benchmarks.single_stream_analysis import timeline_gaps, ttft_breakdown


def test_the_ttft_split_attributes_what_the_parts_leave_to_the_contract_and_the_scheduler():
    parts = ttft_breakdown(
        preprocess_ms=1.5, vision_ms=6.0, prefill_ms=9.0, first_decode_ms=3.5, contract_ms=18.0, service_ms=20.5
    )
    assert parts["contract_overhead_ms"] == pytest.approx(18.0 - 16.5)
    assert parts["scheduler_overhead_ms"] == pytest.approx(20.5 - 18.0)
    assert parts["service_overhead_ms"] == pytest.approx(parts["contract_overhead_ms"] + parts["scheduler_overhead_ms"])
    # the first decode step is reported, but it is not inside the first token's time
    model = parts["preprocess_ms"] + parts["vision_ms"] + parts["prefill_ms"]
    assert model + parts["service_overhead_ms"] == pytest.approx(parts["ttft_service_ms"])


def test_timeline_gaps_tell_the_hosts_waits_from_launch_latency_and_merge_overlaps():
    # two steps of three kernels (2 us launch gaps inside), 100 us of host wait between them, one overlap
    kernels = [(0, 10), (12, 10), (24, 10), (134, 10), (136, 4), (146, 10), (158, 10)]
    gaps = timeline_gaps(reversed(kernels), host_gap_us=10)
    assert gaps["span_us"] == 168
    assert gaps["host_gap_us"] == 100 and gaps["host_gaps"] == 1
    assert gaps["launch_gap_us"] == 2 + 2 + 2 + 2
    assert gaps["busy_us"] == gaps["span_us"] - gaps["host_gap_us"] - gaps["launch_gap_us"]
    assert gaps["host_gap_fraction"] == pytest.approx(100 / 168)


def test_an_empty_timeline_says_what_is_missing():
    with pytest.raises(ValueError, match="no kernels"):
        timeline_gaps([])
