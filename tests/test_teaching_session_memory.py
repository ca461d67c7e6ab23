"""Memory held per /teaching session: 12 API sessions each upload their own 6000 x 6000 film and go idle. A session
keeps the viewer's overview of its film (at most 1080 px) and the model's 896-px input; the full-resolution values
stay in the intake's one cache, within FILM_CACHE_MB whatever the number of sessions. Before, each session held
the film at full resolution: 324 MiB a session."""

from __future__ import annotations

import io

import numpy as np
import pytest
from gradio_client import Client, handle_file

from devtools.loadtest import rss_bytes
from tests.conftest import start_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
SESSIONS = 12
FILM_CACHE_MB = 256
# A session: the overview (1080 x 1080 float32, 4.7 MB), the model's input (2.4 MB), a 512-px copy, Gradio's
# bookkeeping. 16 MiB is generous; the full-resolution values alone are 144 MB.
PER_SESSION_BYTES = 16 << 20
TRANSIENT_BYTES = 768 << 20  # one film in flight (its values, the 8-bit film, the PNG), allocator slack


def big_film_png(seed: int) -> bytes:
    from PIL import Image

    rows = np.linspace(0, 255, 6000, dtype=np.float32)
    tilt = 0.3 + 0.02 * seed  # each session's film differs, so none is shared through the intake's cache
    pixels = (rows[:, None] * (1 - tilt) + rows[None, :] * tilt).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_twelve_idle_teaching_sessions_on_big_films_hold_their_overviews_only(tmp_path):
    # The 6000 x 6000 films are smooth ramps, not chest films: the film check would refuse them, and this test is
    # about what a session holds once a big film is accepted.
    env = {"FILM_CHECK": "off", "MAX_NEW_TOKENS": "4", "FILM_CACHE_MB": str(FILM_CACHE_MB)}
    server = start_server(tmp_path / "logs", env=env)
    try:
        pid = server.process.pid
        warm = Client(server.url, verbose=False, download_files=False)
        warm_film = tmp_path / "warm.png"
        warm_film.write_bytes(big_film_png(99))
        warm.predict(handle_file(str(warm_film)), api_name="/teaching_upload_film")  # imports, first allocations
        start = rss_bytes(pid)
        bound = start + (FILM_CACHE_MB << 20) + SESSIONS * PER_SESSION_BYTES + TRANSIENT_BYTES
        peaks = []
        for seed in range(SESSIONS):
            film = tmp_path / f"film-{seed}.png"
            film.write_bytes(big_film_png(seed))
            client = Client(server.url, verbose=False, download_files=False)  # a session of its own, left idle
            info = client.predict(handle_file(str(film)), api_name="/teaching_upload_film")  # the case's notes
            assert "6000×6000 px" in info, info
            peaks.append(rss_bytes(pid))
            if peaks[-1] > bound:
                break  # the old code would take this machine's memory: stop here
        idle = rss_bytes(pid)
        print(f"\nRSS start {start >> 20} MiB, after {len(peaks)} sessions {idle >> 20} MiB, bound {bound >> 20} MiB")
        assert len(peaks) == SESSIONS and max(peaks) <= bound, [p >> 20 for p in peaks]
        # A zoomed view of an early session's film, whose values the cache has let go, still renders.
        assert warm.predict(api_name="/teaching_zoom_in")[3].startswith("Ruler")
    finally:
        server.stop()
