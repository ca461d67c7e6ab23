"""The real server, each decode step of its backend made to take at least TEST_DECODE_PACE_S seconds.

Tests of time limits need an answer whose length in seconds does not depend on the machine: a fast idle machine
once finished 2,048 tokens inside the limit that a loaded one overran. The pace is a floor (a sleep after the real
step), so a slower machine only makes answers longer. Run from the repository root: python
tests/support/paced_server.py ... (the same arguments as app.py).
"""

from __future__ import annotations

import os
import time

from medgemma_xray.serving.factory import create_backend


def paced_factory(mode, settings):
    backend = create_backend(mode, settings)
    pace_s = float(os.environ.get("TEST_DECODE_PACE_S", "0"))
    decode = backend._decode_impl

    def paced_decode(*args, **kwargs):
        started = time.monotonic()
        result = decode(*args, **kwargs)
        time.sleep(max(0.0, pace_s - (time.monotonic() - started)))
        return result

    backend._decode_impl = paced_decode
    return backend


if __name__ == "__main__":
    from medgemma_xray.web.app import main

    raise SystemExit(main(backend_factory=paced_factory))
