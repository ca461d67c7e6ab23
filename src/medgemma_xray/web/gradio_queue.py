"""Gradio's queue, adjusted for a server that runs for weeks beside other users' work: two of its defaults cost
something (idle CPU, a rare abort at exit) and buy this server nothing. No public setting reaches either, so each
adjustment checks that the attribute it sets still exists and refuses to start on a Gradio that has changed."""

from __future__ import annotations

import math


def tune_queue(demo) -> None:
    """Both adjustments; the queue exists once demo.queue() ran."""
    quiet_idle_queue(demo)
    skip_queue_analytics(demo)


# Gradio's queue looks for work every 1 ms while it has none: with its 10 ms progress check, ~800 wake-ups a
# second of the main thread, 4-6% of a core on this host, spent by every idle server on a shared workstation.
# 10 ms is far below what a person notices; a question waits at most 10 ms more to start. The progress check
# keeps Gradio's 10 ms: at 100 ms, Gradio's cancel (the teaching page's Stop) left the answer's generator open,
# holding its lease, in 3 of 6 runs of test_teaching_browser.py's Stop test beside a busy core (1 in 5 with Gradio's
# own timings, 1 in 4 with this one): SIGTERM then waits DRAIN_TIMEOUT_S. Not fixed here; see the README.
QUEUE_POLL_S = 0.010


def quiet_idle_queue(demo) -> None:
    """Slow the idle polling of Gradio's queue (gradio/queueing.py: Queue.sleep_when_free, which no public setting
    reaches). The queue exists once demo.queue() ran."""
    queue = demo._queue
    if not hasattr(queue, "sleep_when_free"):
        raise RuntimeError("this Gradio's queue has no sleep_when_free: check serving/gradio_queue.quiet_idle_queue")
    queue.sleep_when_free = QUEUE_POLL_S


def skip_queue_analytics(demo) -> None:
    """Never summarise finished events (gradio/queueing.py: Queue.compute_analytics_summary, run after every event
    while ANAYLTICS_CACHE_FREQUENCY, Gradio's spelling, is 1). It runs pandas and np.percentile in a daemon worker
    thread after the answer has gone out; a process that exits meanwhile cancels that thread inside numpy's C++
    code and aborts ("terminate called without an active exception", exit -6). The summary feeds only Gradio's
    /monitoring pages, which RouteGuard keeps out of reach; /metrics has the figures an operator needs."""
    queue = demo._queue
    if not hasattr(queue, "ANAYLTICS_CACHE_FREQUENCY"):
        raise RuntimeError("this Gradio's queue has no ANAYLTICS_CACHE_FREQUENCY: check serving/gradio_queue")
    queue.ANAYLTICS_CACHE_FREQUENCY = math.inf  # events since the last summary are never >= infinity
