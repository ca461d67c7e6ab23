"""Memory held per session: 200 API sessions each load a 6000 x 6000 film and go idle. The
server's RSS stays under a stated bound while they are idle, and every case is dropped once its state's
time-to-live has passed (RSS printed; README says how far it falls). Before, each such session held about 178 MiB (the full film and its full-size padded RGB square) until
10,000 other sessions pushed it out."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest
from gradio_client import Client, handle_file

from devtools.loadtest import rss_bytes
from medgemma_xray.serving.memory import TRIM_DELAY_S
from tests.conftest import start_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
SESSIONS = 200
CLIENTS = 4
TTL_S = 20
# What 200 idle cases may hold: each keeps a 896-px RGB model input (2.4 MB) and a 512-px copy of the film, plus
# Gradio's per-session bookkeeping; 4 MiB a session is generous. The full film alone is 36 MB.
PER_SESSION_BYTES = 4 << 20
TRANSIENT_BYTES = 768 << 20  # films in flight (4 at once), allocator slack


def big_film_png() -> bytes:
    from PIL import Image

    rows = np.linspace(0, 255, 6000, dtype=np.float32)
    pixels = (rows[:, None] * 0.6 + rows[None, :] * 0.4).astype(np.uint8)  # smooth: a small PNG
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def ask_once_expired(client: Client, loaded_at: float) -> str | None:
    """The error a question in client's session gets once its case, loaded at loaded_at (time.monotonic()), has
    passed its time-to-live; None if the case is still held after 4 TTLs. The first try comes TTL_S + 2 s after
    the load (at once if that is past), not a fixed time after the caller's last step."""
    deadline = loaded_at + 4 * TTL_S + 90
    next_try = loaded_at + TTL_S + 2  # Gradio drops expired state once a second
    while next_try < deadline:
        time.sleep(max(0.0, next_try - time.monotonic()))
        try:
            client.predict("Findings?", api_name="/ask")
        except Exception as exc:  # gradio_client raises the handler's gr.Error
            return str(exc)
        next_try = time.monotonic() + TTL_S + 2  # the answer refreshed the case's time-to-live
    return None


def test_two_hundred_idle_sessions_with_big_films_stay_bounded_and_are_released(tmp_path):
    film = tmp_path / "film-6000.png"
    film.write_bytes(big_film_png())
    # The 6000x6000 film is a phantom scaled far past any real detector, which the film check refuses;
    # this test is about what a session holds once a big film is accepted, so the check is off here.
    env = {"SESSION_TTL_S": str(TTL_S), "MAX_NEW_TOKENS": "4", "FILM_CHECK": "off"}
    server = start_server(tmp_path / "logs", env=env)
    try:
        pid = server.process.pid
        warm = Client(server.url, verbose=False, download_files=False)  # the preview is not looked at here
        warm.predict(handle_file(str(film)), api_name="/upload_film")  # pays for imports and first allocations
        start = rss_bytes(pid)
        bound = start + SESSIONS * PER_SESSION_BYTES + TRANSIENT_BYTES
        warm_loaded_at = time.monotonic()  # the warm session's case was set before its upload returned
        loaded, failures, over = [0], [], threading.Event()
        newest: list = [warm_loaded_at, warm]  # when the last load returned, and the client whose session it was
        lock = threading.Lock()

        def client_loop(share: int) -> None:
            client = Client(server.url, verbose=False, download_files=False)
            for _ in range(share):
                if over.is_set():
                    return
                client.reset_session()  # a new API session: no heartbeat, never closed
                try:
                    summary = client.predict(handle_file(str(film)), api_name="/upload_film")[1]
                    assert "6000×6000" in summary, summary
                except Exception as exc:
                    failures.append(repr(exc)[:300])
                    return
                with lock:
                    loaded[0] += 1
                    newest[:] = [time.monotonic(), client]  # the last load so far returned before this
                if rss_bytes(pid) > bound:
                    over.set()  # stop early: the old code would take this machine's memory

        threads = [threading.Thread(target=client_loop, args=(SESSIONS // CLIENTS,)) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        idle_rss = rss_bytes(pid)
        assert failures == []
        assert not over.is_set() and idle_rss <= bound, (
            f"{loaded[0]} sessions: RSS {idle_rss >> 20} MiB, bound {bound >> 20} MiB (start {start >> 20} MiB)"
        )
        assert loaded[0] == SESSIONS

        # After the time-to-live every case is dropped: the first session (loaded before all the others) has none,
        # nor has the session whose load returned last. Every case was set before its load returned, so when that
        # session is asked (TTL_S + 2 s after its load returned, or later) each case has passed its TTL by 2 s or
        # more, and Gradio's once-a-second sweep has dropped them all.
        # A question answered refreshes its session's time-to-live, so a try that comes too early is followed by
        # another a whole TTL later. Gradio drops expired state once a second (and a request reads a session's
        # state as held, expired or not), so a refused question means the case was dropped.
        expired = ask_once_expired(warm, warm_loaded_at)
        assert expired is not None and "Upload a chest X-ray first" in expired, expired
        newest_loaded_at, newest_client = newest
        expired = ask_once_expired(newest_client, newest_loaded_at)
        assert expired is not None and "Upload a chest X-ray first" in expired, expired
        time.sleep(TRIM_DELAY_S + 5)  # the one malloc_trim after the burst of expiries (scheduled TRIM_DELAY_S on)
        settled = rss_bytes(pid)
        print(f"\nRSS start {start >> 20} MiB, 200 idle {idle_rss >> 20} MiB, after the TTL {settled >> 20} MiB")
        assert settled <= idle_rss
    finally:
        server.stop()
