"""The circuit breaker alone: N consecutive failures trip it exactly once; a success resets the count."""

from __future__ import annotations

import threading

import pytest

from medgemma_xray.serving.breaker import CircuitBreaker


def test_trips_once_after_consecutive_failures_and_a_success_resets_the_count():
    breaker = CircuitBreaker(threshold=3)
    assert [breaker.record_failure("a"), breaker.record_failure("b")] == [False, False]
    breaker.record_success()
    assert [breaker.record_failure(str(i)) for i in range(5)] == [False, False, True, False, False]
    snapshot = breaker.snapshot()
    assert (snapshot.state, snapshot.trips, snapshot.last_failure) == ("open", 1, "4")
    breaker.reset()
    assert breaker.snapshot().state == "closed" and breaker.snapshot().consecutive_failures == 0


def test_concurrent_failures_trip_it_exactly_once():
    breaker = CircuitBreaker(threshold=5)
    trips = []
    threads = [threading.Thread(target=lambda: trips.append(breaker.record_failure("x"))) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert trips.count(True) == 1 and breaker.snapshot().trips == 1


def test_a_threshold_below_one_is_refused():
    with pytest.raises(ValueError, match="threshold must be >= 1"):
        CircuitBreaker(0)
