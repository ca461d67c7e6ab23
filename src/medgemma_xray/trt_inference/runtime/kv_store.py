"""KV buffers on the host, allocated once and bound to ONNX Runtime where they lie (engine_bundle/kv_layout.py).

One KvStore holds, for every layer and kind, one flat float32 buffer of rows x kv_heads x max_rows x head_dim,
made once (np.zeros: the operating system hands out zeroed pages as they are first touched, so an idle slot costs
no memory). The graph sees it as (rows, kv_heads, capacity, head_dim), the buffer's first elements; growing the
capacity re-lays the kept rows in place, once every KV_BLOCK tokens. Nothing here copies the past on a step:
`append` writes only the new rows.
"""

from __future__ import annotations

import numpy as np


class KvStore:
    def __init__(self, tensors: int, max_batch: int, kv_heads: int, head_dim: int, max_rows: int) -> None:
        self.kv_heads, self.head_dim, self.max_rows, self.max_batch = kv_heads, head_dim, max_rows, max_batch
        self.flat = [np.zeros(max_batch * kv_heads * max_rows * head_dim, dtype=np.float32) for _ in range(tensors)]
        self.batch, self.capacity = max_batch, 0
        self._views: list[np.ndarray] = self._make_views()

    def views(self) -> list[np.ndarray]:
        """Every layer's and kind's cache as (batch, kv_heads, capacity, head_dim): contiguous views of the buffers
        (made again only when the shape changes)."""
        return self._views

    def _make_views(self) -> list[np.ndarray]:
        size = self.batch * self.kv_heads * self.capacity * self.head_dim
        shape = (self.batch, self.kv_heads, self.capacity, self.head_dim)
        return [flat[:size].reshape(shape) for flat in self.flat]

    def reshape(self, batch: int, capacity: int, keep: int = 0) -> None:
        """View the buffers as (batch, kv_heads, capacity, head_dim), moving the first `keep` rows of every
        (sequence, head) to where the new capacity puts them (in place; numpy copies overlapping ranges exactly).
        `keep` needs the batch unchanged; with keep=0 the rows' contents are left as they are (finite, unused)."""
        if batch > self.max_batch or capacity > self.max_rows:
            raise ValueError(f"{batch} x {capacity} rows exceed the store's {self.max_batch} x {self.max_rows}")
        if keep and (batch != self.batch or keep > min(capacity, self.capacity)):
            raise ValueError(
                f"cannot keep {keep} rows of a {self.batch} x {self.capacity} cache at {batch} x {capacity}"
            )
        if keep and capacity != self.capacity:
            blocks, dim = batch * self.kv_heads, self.head_dim
            for flat in self.flat:
                old = flat[: blocks * self.capacity * dim].reshape(blocks, self.capacity, dim)
                new = flat[: blocks * capacity * dim].reshape(blocks, capacity, dim)
                new[:, :keep] = old[:, :keep]
        self.batch, self.capacity = batch, capacity
        self._views = self._make_views()

    def append(self, start: int, rows: list[np.ndarray]) -> None:
        """Write the new rows (batch, kv_heads, new, head_dim) of every layer and kind at row `start`."""
        for view, new in zip(self.views(), rows, strict=True):
            view[:, :, start : start + new.shape[2]] = new
