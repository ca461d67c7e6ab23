"""The contract's own rules, on a scripted backend (no model): a backend is a context manager that closes on
every way out, and a closed backend refuses work with a clear error."""

from __future__ import annotations

import pytest

from medgemma_xray.inference_api.errors import BackendClosedError
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, Mode
from tests.support.scripted_backend import ScriptedBackend


def request() -> GenerationRequest:
    return GenerationRequest(None, (ChatTurn("user", "Findings?"),))


def test_with_block_returns_the_backend_and_closes_it():
    with ScriptedBackend(Mode.PYTORCH) as backend:
        assert backend.generate(request()) == "abcdefgh"
    assert backend.closed and backend.closed_count == 1


def test_an_exception_inside_the_block_still_closes_once_and_propagates():
    with pytest.raises(ZeroDivisionError), ScriptedBackend(Mode.PYTORCH) as backend:
        raise ZeroDivisionError
    assert backend.closed_count == 1
    backend.close()  # idempotent
    assert backend.closed_count == 1


def test_a_closed_backend_cannot_be_entered_or_used():
    backend = ScriptedBackend(Mode.PYTORCH)
    backend.close()
    with pytest.raises(BackendClosedError, match="closed"), backend:
        pass
    with pytest.raises(BackendClosedError):
        backend.generate(request())
