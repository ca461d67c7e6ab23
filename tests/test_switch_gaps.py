"""benchmarks/switch_gaps.py's accounting: which gaps count as at a switch, and the largest gap per switch."""

from __future__ import annotations

from benchmarks.switch_gaps import Stream, Switch, analyse


def test_a_gap_overlapping_a_switch_counts_at_it_and_the_rest_are_steady():
    switches = [Switch(began=10.0, ended=12.0, to="trt", ok=True, said=""), Switch(30.0, 30.5, "pytorch", True, "")]
    streams = [
        Stream(0, asked=0.0, chunks=[0.3, 0.4, 0.5, 0.6]),  # steady: first wait 0.3 s, gaps 0.1 s
        Stream(1, asked=8.0, chunks=[8.2, 8.3, 11.9, 12.0]),  # one steady gap, then 3.6 s across the first switch
        Stream(2, asked=29.8, chunks=[31.2, 31.3]),  # waited 1.4 s through the second switch
        Stream(3, asked=40.0, error="APIConnectionError: refused"),
    ]
    result = analyse(streams, switches)
    assert result["gaps"]["switch"]["max_ms"] == 3600.0
    assert result["gaps"]["steady"]["max_ms"] == 100.0 and result["gaps"]["steady"]["count"] == 4
    assert result["ttft"]["switch"]["max_ms"] == 1400.0 and result["ttft"]["steady"]["count"] == 2
    assert result["largest_gap_per_switch_ms"] == [3600.0, 100.0]
    assert result["answers"] == 4 and result["failed"] == ["APIConnectionError: refused"]


def test_a_gap_within_the_margin_after_a_switch_still_counts_at_it():
    switches = [Switch(10.0, 11.0, "trt", True, "")]
    result = analyse([Stream(0, asked=11.5, chunks=[11.6, 11.9, 12.5, 12.6])], switches)
    assert result["gaps"]["switch"]["count"] == 2 and result["gaps"]["steady"]["count"] == 1
