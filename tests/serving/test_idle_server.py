"""An idle server stays asleep: on a shared workstation it sits beside other users' work all day. Gradio's queue
polled for work every 1 ms (~780 wake-ups a second of the server's main thread here, 6% of a core); with
medgemma_xray.web.gradio_queue.quiet_idle_queue it wakes ~120 times a second. Counted in wake-ups, not CPU seconds, so the
bound holds on a slow machine and a fast one alike."""

from __future__ import annotations

import time
from pathlib import Path

MEASURE_S = 5.0
MAX_WAKE_UPS_PER_S = 300  # the queue's 100 polls, Gradio's progress check, uvicorn's 10 ticks, with room


def voluntary_switches(pid: int) -> int:
    """How often the process's main thread (the event loop) went to sleep and woke again."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc status")


def test_an_idle_server_wakes_at_most_a_few_hundred_times_a_second(demo_server):
    pid = demo_server.process.pid
    time.sleep(1)  # whatever an earlier test asked of this shared server has settled
    before, started = voluntary_switches(pid), time.monotonic()
    time.sleep(MEASURE_S)
    rate = (voluntary_switches(pid) - before) / (time.monotonic() - started)
    assert rate < MAX_WAKE_UPS_PER_S, f"the idle server's main thread woke {rate:.0f} times a second"
