"""The next decode step queued on the GPU before the host reads this one (issue 21, CPU/GPU overlap).

At batch 1 the host's share of a token (reading the id back, the contract's bookkeeping, the scheduler's turn)
used to run while the GPU waited: every step began only after the previous one's id had reached the host. Here,
right after a step is launched, the same step is launched again one position on, fed on the device with the id
the first one produces (CUDA-graph inputs are device buffers, so nothing waits on the host). When the contract then
asks for exactly that step (same slots, next positions, the ids just returned) its result is already computed or
in flight; otherwise it is dropped and the step asked for runs as before.

Exact: a step that is used computed the same function on the same inputs. A step that is dropped (the answer
ended, or the batch changed) only wrote its key/value one position past each sequence's end, which the next
prefill or step overwrites before anything reads it; the backend forgets the queued step whenever a slot is
allocated, freed, prefilled or truncated, so a reused slot never takes another conversation's step. The cost is
one wasted step at the end of each answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Launch = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class _Readback:
    """A launched step's ids and log-probabilities, copied to pinned host memory behind it in the stream."""

    def __init__(self, ids: torch.Tensor, logprobs: torch.Tensor, buffers: tuple[torch.Tensor, torch.Tensor] | None):
        batch = ids.shape[0]
        if buffers is None:  # CPU: the step already ran
            self.ids, self.logprobs, self.event = ids.clone(), logprobs.clone(), None
            return
        host_ids, host_logprobs = buffers
        self.ids, self.logprobs = host_ids[:batch], host_logprobs[:batch]
        self.ids.copy_(ids, non_blocking=True)
        self.logprobs.copy_(logprobs, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def wait(self) -> tuple[list[int], list[float]]:
        if self.event is not None:
            self.event.synchronize()  # the one host wait per token
        return self.ids.tolist(), self.logprobs.tolist()


class PipelinedDecode:
    """step(tokens, positions, slots) -> (ids, logprobs) as lists, with the following step queued behind it.

    launch(tokens, positions, slots): enqueue one step from host lists, returning device (ids, logprobs);
    launch_next(batch): enqueue the step after the last one launched, fed with its ids at positions + 1, returning
    the same. `owner` names what launched (the CUDA graphs in use), so a swapped step function drops the queue."""

    def __init__(self, launch: Launch, launch_next: Launch, max_len: int, max_batch: int, device: torch.device):
        self.launch, self.launch_next = launch, launch_next
        self.max_len = max_len
        self._pending: tuple[Any, _Readback] | None = None
        self._buffers: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        if device.type == "cuda":
            self._buffers = [
                (
                    torch.zeros(max_batch, dtype=torch.long, pin_memory=True),
                    torch.zeros(max_batch, dtype=torch.float32, pin_memory=True),
                )
                for _ in range(2)
            ]
        self._turn = 0
        self.hits = 0  # steps whose result was already queued (the benchmark reads these)
        self.misses = 0

    def forget(self) -> None:
        """Drop the queued step: call whenever a slot's KV changes other than by a decode step."""
        self._pending = None

    def _readback(self, ids: torch.Tensor, logprobs: torch.Tensor) -> _Readback:
        buffers = None
        if self._buffers is not None:
            buffers = self._buffers[self._turn]
            self._turn ^= 1
        return _Readback(ids, logprobs, buffers)

    def step(self, tokens: list[int], positions: list[int], slots: list[int], owner: Any = None):
        key = (owner, tuple(slots), tuple(positions), tuple(tokens))
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == key:
            result = pending[1]
            self.hits += 1
        else:
            result = self._readback(*self.launch(tokens, positions, slots))
            self.misses += 1
        queued = None
        if max(positions) + 1 < self.max_len:
            queued = self._readback(*self.launch_next(len(tokens)))
        ids, logprobs = result.wait()
        if queued is not None:
            following = tuple(p + 1 for p in positions)
            self._pending = ((owner, tuple(slots), following, tuple(ids)), queued)
        return ids, logprobs
