"""How the batch runner hands generation requests to a backend: one call for many requests, many films in flight.

RunRequests takes a list of requests and returns, in the same order, (answer text, stats) for each request, or
the exception that request raised (so one bad film never fails the others). Today's implementation runs them one
by one through backend.stream_generate; the serving layer's batching scheduler has the same signature.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inference_api.types import GenerationRequest, GenerationStats

Outcome = tuple[str, GenerationStats] | Exception
RunRequests = Callable[[Sequence[GenerationRequest]], list[Outcome]]


def sequential_requests(backend) -> RunRequests:
    """RunRequests over backend.stream_generate, one request after another."""

    def run_requests(requests: Sequence[GenerationRequest]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for request in requests:
            stats = GenerationStats()
            try:
                text = "".join(backend.stream_generate(request, stats))
            except Exception as exc:  # recorded against this film; the batch goes on
                outcomes.append(exc)
            else:
                outcomes.append((text, stats))
        return outcomes

    return run_requests
