"""Test inputs in the paged KV layout: a slot-per-sequence cache scattered over pages in a shuffled order, so a
kernel that ignores the block table (or reads a neighbour's page) reads the wrong keys."""

from __future__ import annotations

import torch

from medgemma_xray.pytorch_backend.decode_attention import PAGE_TOKENS


def to_pages(*slotted: torch.Tensor, seed: int = 0):
    """slotted: caches (sequences, kv_heads, length, dim), length a multiple of PAGE_TOKENS. Returns the same caches
    as pages (sequences * length / PAGE_TOKENS + 1, PAGE_TOKENS, kv_heads, dim), the last page NaN (never named),
    and the block tables (sequences, length / PAGE_TOKENS) int32."""
    sequences, kv_heads, length, dim = slotted[0].shape
    per_sequence = length // PAGE_TOKENS
    order = torch.randperm(sequences * per_sequence, generator=torch.Generator().manual_seed(seed))
    tables = order.view(sequences, per_sequence).to(torch.int32)
    paged = []
    for cache in slotted:
        pages = torch.full((sequences * per_sequence + 1, PAGE_TOKENS, kv_heads, dim), float("nan"), dtype=cache.dtype)
        blocks = cache.view(sequences, kv_heads, per_sequence, PAGE_TOKENS, dim).permute(0, 2, 3, 1, 4)
        pages[tables.long().flatten()] = blocks.reshape(-1, PAGE_TOKENS, kv_heads, dim)
        paged.append(pages)
    return (*paged, tables)


def to_slots(pages: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """The inverse: (sequences, kv_heads, length, dim) from pages and block tables."""
    sequences, per_sequence = tables.shape
    blocks = pages[tables.long().flatten()].view(sequences, per_sequence, PAGE_TOKENS, *pages.shape[2:])
    return blocks.permute(0, 3, 1, 2, 4).reshape(sequences, pages.shape[2], per_sequence * PAGE_TOKENS, -1)
