"""How the batch runner hands generation requests to a backend: one call for many requests, many films in flight.

RunRequests takes a list of requests and returns, in the same order, (answer text, stats) for each request, or
the exception that request raised (so one bad film never fails the others). Two implementations:
- scheduled_requests: every request submitted at once to a serving scheduler (iteration-level batching: one
  vision batch for the new films, one batched decode step for all running answers);
- sequential_requests: one after another through backend.stream_generate (the reference; --one_by_one).
Both give the same answers: decoding is greedy either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from medgemma_xray.inference_api.types import GenerationRequest, GenerationStats

Outcome = tuple[str, GenerationStats] | Exception
RunRequests = Callable[[Sequence[GenerationRequest]], list[Outcome]]
ANSWER_TIMEOUT_S = 3600.0  # a batch waits for slow hosts; a stuck answer still ends, as a recorded failure


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


def scheduled_requests(scheduler, timeout_s: float = ANSWER_TIMEOUT_S) -> RunRequests:
    """RunRequests through a scheduler (medgemma_xray.serving.scheduler.Scheduler: submit(request, stats) -> ticket, and
    ticket.deltas(admission_timeout_s, progress_timeout_s)). All requests are submitted before any is read, so the
    scheduler runs them together; its max_active and max_waiting should hold one chunk's requests."""

    def run_requests(requests: Sequence[GenerationRequest]) -> list[Outcome]:
        submitted = []
        for request in requests:
            stats = GenerationStats()
            try:
                submitted.append((scheduler.submit(request, stats), stats))
            except Exception as exc:  # the scheduler refused it (closed, or its queue is full)
                submitted.append((exc, stats))
        outcomes: list[Outcome] = []
        for ticket, stats in submitted:
            if isinstance(ticket, Exception):
                outcomes.append(ticket)
                continue
            try:
                text = "".join(ticket.deltas(timeout_s, timeout_s))
            except Exception as exc:
                ticket.cancel()
                outcomes.append(exc)
            else:
                outcomes.append((text, stats))
        return outcomes

    return run_requests
