"""A new conversation's prompt prefilled by replaying a CUDA graph captured for its size bucket.

Measured on the H200 (2026-12-01): a 400-token prefill took 39 ms through the packed, compiled-per-layer path,
against a floor of about 5 ms (3.2 TFLOP and one read of 7.8 GB of weights). The rest is launch and Python
overhead: 34 layers, each a compiled graph, an eager attention and its mask, and the cache writes. Replaying one
captured graph submits all of it at once.

A graph has fixed shapes, so a prompt is padded to the smallest bucket that holds it (DEFAULT_PREFILL_BUCKETS). The
padding rows come after every prompt row, so causal masking keeps them out of the prompt's attention; their keys
and values go to the decoder's dummy page (PagedGemmaDecoder.prefill_static). Only what a fresh conversation
prefills in one chunk from position 0 takes this path: a follow-up turn, a shared prefix or a chunked long prompt
keeps the packed path.

Without CUDA graphs (CPU, the tests) the same padded function runs eagerly: that is how CI checks that padding
changes no token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)

# Every 64 rows up to 512, then every 128: padding is at most 64 rows for the usual prompts (a film's 256 image
# tokens and a question: 300-450), so it costs at most ~15% of a prefill that is compute-bound (H200, 2026-12-02:
# a 400-token prompt padded to 512 took 9.5 ms). Each bucket is one graph in one shared memory pool.
DEFAULT_PREFILL_BUCKETS = (64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024)


def prefill_bucket(tokens: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding `tokens` rows, or None when none does (the packed path takes it then).

    A single token never takes a bucket: there is nothing to gain, and the packed path pads it already."""
    if tokens < 2:
        return None
    for bucket in sorted(buckets):
        if bucket >= tokens:
            return bucket
    return None


def usable_buckets(buckets: Sequence[int], max_sequence: int) -> tuple[int, ...]:
    """The buckets whose padding rows still fit in a slot (positions up to bucket - 1 < max_sequence)."""
    return tuple(sorted(b for b in set(buckets) if 2 <= b <= max_sequence))


def image_rows(ids: Sequence[int], image_token_id: int | None) -> tuple[list[int], list[int]]:
    """(row of each image token, image block id of every row: -1 for text, 0, 1, ... per run of image tokens),
    computed from the host's token ids, so placing the film's features needs no device-to-host read."""
    rows, blocks, block, previous = [], [], -1, False
    for index, token in enumerate(ids):
        is_image = image_token_id is not None and token == image_token_id
        if is_image:
            if not previous:
                block += 1
            rows.append(index)
        blocks.append(block if is_image else -1)
        previous = is_image
    return rows, blocks


class PrefillGraphs:
    """Static input buffers and, with `capture`, one CUDA graph per bucket of decoder.prefill_static."""

    def __init__(self, decoder, buckets: Sequence[int], capture: bool, dummy_row: int) -> None:
        self.decoder = decoder
        self.buckets = usable_buckets(buckets, decoder.max_len)
        if not self.buckets:
            raise ValueError(f"no prefill bucket fits a slot of {decoder.max_len} tokens: {tuple(buckets)}")
        device, largest = decoder.device, self.buckets[-1]
        self.embeds = torch.zeros((largest, decoder.hidden), device=device, dtype=decoder.dtype)
        self.blocks = torch.full((largest,), -1, dtype=torch.long, device=device)
        self.row = torch.full((1,), dummy_row, dtype=torch.long, device=device)
        self.last_row = torch.zeros(1, dtype=torch.long, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        if capture:
            pool = torch.cuda.graph_pool_handle()
            for bucket in reversed(self.buckets):  # largest first: the smaller ones reuse its memory pool
                self.graphs[bucket] = self._capture(bucket, pool)

    def _arguments(self, bucket: int):
        return self.embeds[:bucket], self.blocks[:bucket], self.row, self.last_row

    def _capture(self, bucket: int, pool):
        step = self.decoder.prefill_static
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):  # compile, pick kernels and allocate outside the capture
                step(*self._arguments(bucket))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool), torch.inference_mode():
            ids, logprobs = step(*self._arguments(bucket))
        return graph, ids, logprobs

    def bucket_for(self, tokens: int) -> int | None:
        return prefill_bucket(tokens, self.buckets)

    def run(self, row: int, embeds: torch.Tensor, blocks: list[int]):
        """Prefill embeds (n, hidden) into sequence row `row` from position 0 (its pages in place); (ids (1,),
        logprobs (1,)) on the device, the first token also left in the row's device state.

        The caller checked bucket_for(n) is not None. The result tensors are the graph's own outputs: read them
        before the next run."""
        n = embeds.shape[0]
        bucket = self.bucket_for(n)
        if bucket is None:
            raise ValueError(f"a prompt of {n} tokens fits no prefill bucket {self.buckets}")
        padded = blocks + [-1] * (bucket - n)
        self.embeds[:n].copy_(embeds)
        self.embeds[n:bucket].zero_()  # zero rows: RMSNorm of zero is zero, never NaN
        staging = torch.tensor([row, n - 1, *padded], dtype=torch.long)
        if self.embeds.is_cuda:
            staging = staging.pin_memory()  # an asynchronous copy, kept alive by the caching host allocator
        self.row.copy_(staging[:1], non_blocking=True)
        self.last_row.copy_(staging[1:2], non_blocking=True)
        self.blocks[:bucket].copy_(staging[2:], non_blocking=True)
        if bucket in self.graphs:
            graph, ids, logprobs = self.graphs[bucket]
            graph.replay()
            return ids, logprobs
        with torch.inference_mode():
            return self.decoder.prefill_static(*self._arguments(bucket))
