"""The decode step captured once per batch-size bucket as a CUDA graph, and replayed each step.

A step of the 4B model launches thousands of small kernels; replaying a graph submits them at once (measured here:
35 ms/token eager, 9 ms captured, 4.5 ms compiled and captured). The graph's only input is the list of sequence
rows (a batch is padded up to the next bucket with the decoder's dummy row): each row's token and position are read
from, and its next ones written back to, the decoder's device state, so a step can be queued before the host has
read the previous one. Nothing here waits for the device.

With `alternatives` (the 8-bit mode: its own step, and the bf16 step over the same state), every bucket is captured
once per step and the fastest replay is kept, so the 8-bit mode is never slower than bf16 at any batch size: its
GEMV wins at one row, and above a crossover measured here at start the dequantising GEMM or the bf16 cuBLAS GEMM
serves, whichever this GPU runs faster. `choices` records what each bucket runs and the times it was chosen on.
"""

from __future__ import annotations

from typing import Any

import torch


class DecodeGraphs:
    def __init__(
        self,
        decoder,
        step,
        buckets: tuple[int, ...],
        device: torch.device,
        alternatives: dict[str, Any] | None = None,
        name: str = "step",
    ) -> None:
        self.decoder = decoder
        self.buckets = tuple(sorted(buckets))
        largest = self.buckets[-1]
        self.rows = torch.full((largest,), decoder.dummy_row, dtype=torch.long, device=device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.choices: dict[int, dict] = {}
        steps = {name: step, **(alternatives or {})}
        for batch in reversed(self.buckets):  # largest first: smaller graphs reuse its memory pool
            captured = {label: self._capture(candidate, batch) for label, candidate in steps.items()}
            if len(captured) == 1 or batch == 1:
                self.graphs[batch] = captured[name]
                continue
            times = {label: self._replay_ms(graph) for label, graph in captured.items()}
            best = min(times, key=lambda label: times[label])
            self.graphs[batch] = captured[best]
            self.choices[batch] = {"runs": best, "replay_ms": {k: round(v, 4) for k, v in times.items()}}

    @staticmethod
    def _replay_ms(captured, repeats: int = 20) -> float:
        graph = captured[0]
        for _ in range(3):
            graph.replay()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    def _capture(self, step, batch: int):
        rows = self.rows[:batch]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):  # compile, autotune and allocate outside the capture (dummy rows only)
                self.decoder.advance(step, rows)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), torch.inference_mode():
            ids, logprobs = self.decoder.advance(step, rows)
        return graph, ids, logprobs

    def bucket_for(self, batch: int) -> int:
        for bucket in self.buckets:
            if bucket >= batch:
                return bucket
        raise ValueError(f"a decode batch of {batch} exceeds the largest captured bucket {self.buckets[-1]}")

    def run(self, rows: list[int]):
        """Queue one step for `rows`; (ids, logprobs) are the graph's own outputs: copy them before the next run."""
        batch = len(rows)
        bucket = self.bucket_for(batch)
        padded = torch.tensor(rows + [self.decoder.dummy_row] * (bucket - batch), dtype=torch.long).pin_memory()
        self.rows[:bucket].copy_(padded, non_blocking=True)
        graph, ids, logprobs = self.graphs[bucket]
        graph.replay()
        return ids[:batch], logprobs[:batch]
