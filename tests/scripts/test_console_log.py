"""The console log under start_gradio.sh: a burst of calls that Gradio refuses before the handler (each prints a
traceback quoting the client's value) leaves the console log small and free of the client's text; the
server's log says, in one fixed line per traceback (rate-limited), which exception it was. An oversized console
log is rotated at the next start."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import free_port
from tests.scripts.harness import Operator

pytestmark = pytest.mark.slow

SECRET = "ZZCONSOLESECRET-" + "q" * 180
BURST = 300
CONSOLE_BOUND = 16 << 10  # bytes: the start's own lines and anything native; the burst alone printed ~750 KB


def wait_for_result(url: str, event_id: str) -> str:
    """The SSE stream of one queued call, to its end: the call has been processed."""
    with httpx.stream("GET", f"{url}/gradio_api/call/teaching_window/{event_id}", timeout=300) as reply:
        return "".join(reply.iter_text())


def test_a_burst_of_malformed_calls_leaves_the_console_log_bounded_and_without_client_text(tmp_path):
    op = Operator(tmp_path / "logs", free_port())
    try:
        started = op.run("start_gradio.sh")
        assert started.returncode == 0, started.stdout + started.stderr
        console = op.log_dir / "gradio_app.console.log"
        before = console.stat().st_size
        event_ids = []
        with httpx.Client(timeout=60) as client:
            for _ in range(BURST):  # one value where the event takes two: Gradio raises, quoting the values
                reply = client.post(f"{op.url}/gradio_api/call/teaching_window", json={"data": [SECRET]})
                assert reply.status_code == 200, reply.text
                event_ids.append(reply.json()["event_id"])
        result = wait_for_result(op.url, event_ids[-1])
        assert "event: error" in result, result[:500]
        deadline = time.monotonic() + 120  # the log line of the last traceback lands right after its error event
        app_log = op.log_dir / "gradio_app.log"
        while "printed a traceback" not in app_log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        grown = console.stat().st_size - before
        text = console.read_text(errors="replace")
        assert grown < CONSOLE_BOUND, f"the console log grew {grown} bytes"
        assert SECRET[:24] not in text and "Traceback" not in text
        logged = app_log.read_text()
        assert "printed a traceback on stderr ending in ValueError" in logged
        assert SECRET[:24] not in logged
        assert logged.count("printed a traceback") < BURST, "the repeat limiter bounds the records"
        assert httpx.get(f"{op.url}/healthz", timeout=30).status_code == 200
    finally:
        op.cleanup()

    console.write_bytes(b"x" * ((10 << 20) + 1))  # a console log past 10 MiB is rotated at the next start
    try:
        assert op.run("start_gradio.sh").returncode == 0
        assert (op.log_dir / "gradio_app.console.log.1").stat().st_size == (10 << 20) + 1
        assert console.stat().st_size < CONSOLE_BOUND
        assert json.loads(op.run("status_gradio.sh", "--json").stdout)["running"] is True
    finally:
        op.cleanup()
