"""How a bundle's decoder holds its KV cache (manifest format 2), shared by export, both executors and calibration.

The decoder takes each layer's past as (batch, kv_heads, capacity, head_dim) and returns as `present` only the
rows of the tokens it was given, (batch, kv_heads, new, head_dim). The runtime owns the cache: buffers allocated
once per slot, bound to the graph where they lie (ONNX Runtime IO binding, TensorRT tensor addresses), and the
new rows written in after each step. A step therefore copies the rows it adds, not every row of the past, which is
what format 1's `present = concat(past, new)` did (and what made a batch of 8 cost 2.6-3.9x one sequence).

Why a capacity, and not the past's exact length: ONNX Runtime and TensorRT take contiguous tensors, and in a
(kv_heads, rows, head_dim) buffer the first `n` rows of every head are not contiguous. So the graph is fed the
whole buffer viewed at its capacity, and the rows past the cache's length are masked (key position -1, as the dead
slot). The capacity grows in KV_BLOCK steps: the re-layout that growing needs copies the past once every KV_BLOCK
tokens, and attention reads at most KV_BLOCK - 1 masked rows. Masked rows must hold finite values (0 x NaN is
NaN); the buffers start as zeros and only ever receive the graph's own outputs.

This is ONNX Runtime GenAI's approach without its contrib operator: with past_present_share_buffer, GenAI
preallocates (batch, kv_heads, max_length, head_dim) buffers and has GroupQueryAttention write the new rows in
place; without it, "the present KV cache buffers are re-allocated before every forward pass of the model and
copied" (onnxruntime.ai/docs/genai/howto/past-present-share-buffer.html), which is what format 1 did.
A contrib operator would not parse in TensorRT, which builds from the same graphs, so here the runtime does the
write, and the capacity (rather than max_length) keeps attention from reading a whole max-length buffer each step.
"""

from __future__ import annotations

import numpy as np

from medgemma_xray.engine_bundle.masks import MASKED

KV_BLOCK = 64


def capacity_for(rows: int, max_rows: int) -> int:
    """The capacity (rows per head) that holds `rows`: a multiple of KV_BLOCK, at most max_rows."""
    if rows > max_rows:
        raise ValueError(f"{rows} KV rows exceed the cache's {max_rows}")
    return min(-(-rows // KV_BLOCK) * KV_BLOCK, max_rows)


def masks_over_capacity(mask: np.ndarray, length: int, capacity: int) -> np.ndarray:
    """A compact mask (batch, 1, new, length + new), whose keys are the cache's `length` rows then the new tokens,
    spread over the graph's keys: `capacity` cache rows (those from `length` on masked), then the new tokens."""
    batch, heads, new, keys = mask.shape
    if keys != length + new or capacity < length:
        raise ValueError(f"a mask of {keys} keys for {length} cached rows + {new} new, at capacity {capacity}")
    spread = np.full((batch, heads, new, capacity + new), MASKED, dtype=np.float32)
    spread[..., :length] = mask[..., :length]
    spread[..., capacity:] = mask[..., length:]
    return spread
