"""Token ids and log-probabilities read back from the device without stopping the host (SGLang's and vLLM V1's
asynchronous output copy).

A launch copies its result tensors into fresh pinned host memory behind the kernels that make them and records an
event; `wait()` blocks only until that event, and only when the host actually needs the tokens. Meanwhile the host
queues the next step, so the device never idles while Python reads the previous one. The pinned buffers come from
PyTorch's caching host allocator, which keeps a buffer alive until the copy into it has run.
"""

from __future__ import annotations

import torch

from medgemma_xray.inference_api.types import TokenStep


class Readback:
    """wait() -> one TokenStep (or None) per entry: entry i reads result row index[i], or None where index[i] is."""

    def __init__(self, ids: torch.Tensor | None, logprobs: torch.Tensor | None, index: list[int | None]) -> None:
        self.index = index
        self.event: torch.cuda.Event | None = None
        if ids is None or logprobs is None:
            self.ids = self.logprobs = None
            return
        if ids.is_cuda:
            self.ids = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self.logprobs = torch.empty(logprobs.shape, dtype=logprobs.dtype, pin_memory=True)
            self.ids.copy_(ids, non_blocking=True)
            self.logprobs.copy_(logprobs, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:  # CPU: the step already ran; own copies, as the graph's outputs are overwritten by the next replay
            self.ids, self.logprobs = ids.clone(), logprobs.clone()

    def wait(self) -> list[TokenStep | None]:
        if self.event is not None:
            self.event.synchronize()  # the one host wait per launch, after the next launch is queued
        if self.ids is None or self.logprobs is None:
            return [None] * len(self.index)
        ids, logprobs = self.ids.tolist(), self.logprobs.tolist()
        return [None if row is None else TokenStep(ids[row], logprobs[row]) for row in self.index]
