"""Gemma 3 attention masks as explicit inputs (numpy, no torch), shared by export, verification and runtime.

The exported decoder takes these masks instead of building them, so no Python branch (sliding window,
image blocks) is baked into the traced graph. The semantics are transformers' own for Gemma 3:
  full layers:    causal OR same-image-block (image tokens see their whole image, bidirectionally)
  sliding layers: (causal OR same-image-block) AND key position > query position - sliding_window
Slot 0 of every KV cache is a dead slot (zeros, always masked), so the decoder never sees a zero-length past;
TensorRT optimization profiles then need no empty tensors.
"""

from __future__ import annotations

import numpy as np

MASKED = np.finfo(np.float32).min
DEAD_SLOTS = 1


def image_block_ids(token_type_ids: np.ndarray) -> np.ndarray:
    """-1 for text; 0, 1, ... for each run of image tokens (as transformers' get_block_sequence_ids_for_mask)."""
    is_image = token_type_ids == 1
    previous = np.pad(is_image, ((0, 0), (1, 0)))[:, :-1]
    starts = is_image & ~previous
    groups = np.cumsum(starts, axis=1) - 1
    return np.where(is_image, groups, -1)


def attention_masks(
    query_positions: np.ndarray,
    key_positions: np.ndarray,
    sliding_window: int,
    query_blocks: np.ndarray | None = None,
    key_blocks: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Additive float32 masks of shape (batch, 1, queries, keys) for full and sliding layers.

    query_positions: (batch, queries) absolute positions. key_positions: (batch, keys) absolute positions,
    -1 for the dead slot and for padding. Blocks: image block ids (-1 = text) for bidirectional image attention.
    """
    q = query_positions[:, :, None]
    k = key_positions[:, None, :]
    present = k >= 0
    causal = (k <= q) & present
    if query_blocks is not None and key_blocks is not None:
        same_block = (query_blocks[:, :, None] >= 0) & (query_blocks[:, :, None] == key_blocks[:, None, :])
        causal = causal | (same_block & present)
    sliding = causal & (k > q - sliding_window)
    full_mask = np.where(causal, 0.0, MASKED).astype(np.float32)[:, None]
    sliding_mask = np.where(sliding, 0.0, MASKED).astype(np.float32)[:, None]
    return full_mask, sliding_mask
