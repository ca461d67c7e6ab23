"""The real server, with its TensorRT backend wrapped to fail the first TEST_TRT_FAULTS answers after warm-up.

The breaker's end-to-end test starts this instead of app.py: fault injection lives here, in a test wrapper around the
real TRTInference, never in production code. Run from the repository root: python tests/support/faulty_server.py ...
"""

from __future__ import annotations

import os

from medgemma_xray.inference_api.types import Mode
from medgemma_xray.serving.factory import create_backend


class InjectedFault(RuntimeError):
    """Raised by the test wrapper in place of a TensorRT failure."""


def faulty_factory(mode, settings):
    backend = create_backend(mode, settings)
    if Mode.parse(mode) is not Mode.TRT:
        return backend
    remaining = [0]
    prefill, warm_up = backend._prefill_impl, backend.warm_up

    def failing_prefill(*args, **kwargs):
        if remaining[0] > 0:
            remaining[0] -= 1
            raise InjectedFault("injected TensorRT fault (test wrapper)")
        return prefill(*args, **kwargs)

    def warm_up_then_arm():
        seconds = warm_up()
        remaining[0] = int(os.environ.get("TEST_TRT_FAULTS", "0"))
        return seconds

    backend._prefill_impl, backend.warm_up = failing_prefill, warm_up_then_arm
    return backend


if __name__ == "__main__":
    from medgemma_xray.web.app import main

    raise SystemExit(main(backend_factory=faulty_factory))
