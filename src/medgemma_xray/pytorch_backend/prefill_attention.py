"""Prefill attention for several prompt chunks at once, over the paged KV cache: one launch per layer.

A packed prefill feeds chunks of several prompts along one token axis. Each chunk's queries attend to its own
sequence's keys (read through its block table, so a prefix shared by reference is read in place) under Gemma 3's
mask: causal, except that the tokens of one image attend to each other both ways, and, in sliding layers, nothing
older than the window. The chunk's own keys are written into the cache before this runs.

Two implementations of one function:
- `reference_prefill_attention`: torch, one chunk at a time (CPU, and the GPU check's reference);
- `triton_prefill_attention`: a flash-attention kernel, grid (query tile, head): each program streams its chunk's
  keys page by page with an online softmax, from the first key any of its rows may see (the window) to the last
  (causal, or the end of an image a row belongs to), so the upper triangle is not computed.
The plan (which chunk each tile belongs to, where its keys end) is made once per packed call on the host, from
the host's token ids, and shared by every layer.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from medgemma_xray.pytorch_backend.decode_attention import PAGE_TOKENS, gather_keys

BLOCK_M = 32  # query rows per program
BLOCK_N = 32  # keys per inner step


@dataclass
class PrefillChunk:
    """Positions start..end-1 of sequence row `row`; blocks: the image block id of every position 0..end-1
    (-1 for text; 0, 1, ... per run of image tokens)."""

    row: int
    start: int
    end: int
    blocks: list[int]


@dataclass
class PrefillPlan:
    """Host lists and their device tensors for one packed call (every layer reads the same plan)."""

    chunks: list[PrefillChunk]
    tile_chunk: torch.Tensor  # (tiles,) int32: the chunk of each query tile
    tile_first: torch.Tensor  # (tiles,) int32: its first query row within the chunk
    tile_key_end: torch.Tensor  # (tiles,) int32: one past the last key position any of its rows may see
    chunk_meta: torch.Tensor  # (chunks, 5) int32: row, start, end, offset of its queries, offset of its blocks
    key_blocks: torch.Tensor  # (sum of chunk ends,) int32: every chunk's image block ids, one after another

    @classmethod
    def build(cls, chunks: list[PrefillChunk], device: torch.device) -> PrefillPlan:
        tile_chunk, tile_first, tile_key_end, meta, blocks = [], [], [], [], []
        query_offset = block_offset = 0
        for index, chunk in enumerate(chunks):
            reach = _reach(chunk.blocks)  # one past the last key each position may see
            for first in range(0, chunk.end - chunk.start, BLOCK_M):
                last = min(chunk.end, chunk.start + first + BLOCK_M)
                tile_chunk.append(index)
                tile_first.append(first)
                tile_key_end.append(max(reach[chunk.start + first : last]))
            meta.append((chunk.row, chunk.start, chunk.end, query_offset, block_offset))
            blocks.extend(chunk.blocks[: chunk.end])
            query_offset += chunk.end - chunk.start
            block_offset += chunk.end
        as_int32 = functools.partial(_int32, device=device)
        return cls(
            chunks,
            as_int32(tile_chunk),
            as_int32(tile_first),
            as_int32(tile_key_end),
            as_int32(meta).reshape(-1, 5),
            as_int32(blocks),
        )


def _int32(values, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=torch.int32)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _reach(blocks: list[int]) -> list[int]:
    """For every position: one past the last key it may see (itself for text, its image's end for image tokens)."""
    reach = [position + 1 for position in range(len(blocks))]
    position = len(blocks) - 1
    while position >= 0:
        if blocks[position] < 0:
            position -= 1
            continue
        end = position + 1
        while position >= 0 and blocks[position] == blocks[end - 1]:
            reach[position] = end
            position -= 1
    return reach


def prefill_mask(chunk: PrefillChunk, window: int, device: torch.device) -> torch.Tensor:
    """(queries, keys) bool: Gemma 3's mask for a chunk's queries over its keys 0..end-1."""
    blocks = torch.tensor(chunk.blocks[: chunk.end], device=device)
    positions = torch.arange(chunk.start, chunk.end, device=device)
    keys = torch.arange(chunk.end, device=device)
    allowed = keys[None, :] <= positions[:, None]
    query_blocks = blocks[positions]
    allowed |= (query_blocks[:, None] >= 0) & (query_blocks[:, None] == blocks[None, :])
    if window:
        allowed &= keys[None, :] > positions[:, None] - window
    return allowed


def reference_prefill_attention(q, k_cache, v_cache, block_tables, plan: PrefillPlan, window: int, scale: float):
    """q: (tokens, heads, dim), the chunks' queries packed in plan order; the caches already hold their keys.
    Returns (tokens, heads, dim)."""
    heads = q.shape[1]
    group = heads // k_cache.shape[2]
    outputs, offset = [], 0
    for chunk in plan.chunks:
        n = chunk.end - chunk.start
        keys = gather_keys(k_cache, block_tables, chunk.row, 0, chunk.end).repeat_interleave(group, dim=0)
        values = gather_keys(v_cache, block_tables, chunk.row, 0, chunk.end).repeat_interleave(group, dim=0)
        mask = prefill_mask(chunk, window, q.device)
        attended = F.scaled_dot_product_attention(
            q[offset : offset + n].transpose(0, 1)[None],
            keys[None],
            values[None],
            attn_mask=mask[None, None],
            scale=scale,
        )
        outputs.append(attended[0].transpose(0, 1))
        offset += n
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def triton_prefill_attention(q, k_cache, v_cache, block_tables, plan: PrefillPlan, window: int, scale: float):
    kernel = _kernel()
    tokens, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape[1] != PAGE_TOKENS:
        raise ValueError(f"the cache's pages hold {k_cache.shape[1]} positions; the kernel reads {PAGE_TOKENS}")
    out = torch.empty_like(q)
    tiles = plan.tile_chunk.shape[0]
    kernel[(tiles, heads)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        block_tables.stride(0),
        plan.tile_chunk,
        plan.tile_first,
        plan.tile_key_end,
        plan.chunk_meta,
        plan.key_blocks,
        *q.stride(),
        *k_cache.stride(),
        *out.stride(),
        scale,
        window if window > 0 else 1 << 30,
        heads // kv_heads,
        DIM=dim,
        BLOCK_DIM=1 << max(0, math.ceil(math.log2(dim))),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        PAGE=PAGE_TOKENS,
        num_warps=4 if dim <= 128 else 8,
        num_stages=2,
    )
    return out


def prefill_attention(q, k_cache, v_cache, block_tables, plan: PrefillPlan, window: int, scale: float):
    """The Triton kernel on CUDA, the torch reference elsewhere."""
    if q.is_cuda:
        return triton_prefill_attention(q, k_cache, v_cache, block_tables, plan, window, scale)
    return reference_prefill_attention(q, k_cache, v_cache, block_tables, plan, window, scale)


@functools.cache
def _kernel():
    """Compile on first use: importing this module must not need Triton (CPU hosts without it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def prefill_kernel(
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        bt_row,
        tile_chunk,
        tile_first,
        tile_key_end,
        chunk_meta,
        key_blocks,
        q_t,
        q_h,
        q_d,
        c_p,
        c_n,
        c_h,
        c_d,
        o_t,
        o_h,
        o_d,
        scale,
        window,
        group,
        DIM: tl.constexpr,
        BLOCK_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PAGE: tl.constexpr,
    ):
        tile = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // group
        chunk = tl.load(tile_chunk + tile)
        first = tl.load(tile_first + tile)
        key_end = tl.load(tile_key_end + tile)
        row = tl.load(chunk_meta + chunk * 5)
        start = tl.load(chunk_meta + chunk * 5 + 1)
        end = tl.load(chunk_meta + chunk * 5 + 2)
        query_offset = tl.load(chunk_meta + chunk * 5 + 3)
        block_offset = tl.load(chunk_meta + chunk * 5 + 4)
        table = block_tables + row * bt_row
        rows = first + tl.arange(0, BLOCK_M)
        row_ok = rows < end - start
        positions = start + rows
        dims = tl.arange(0, BLOCK_DIM)
        dim_ok = dims < DIM
        token = (query_offset + rows).to(tl.int64)
        qt = tl.load(
            q + token[:, None] * q_t + head * q_h + dims[None, :] * q_d,
            mask=row_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )
        query_blocks = tl.load(key_blocks + block_offset + positions, mask=row_ok, other=-1)
        lowest = tl.maximum(start + first - window + 1, 0)
        lo = (lowest // BLOCK_N) * BLOCK_N
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DIM], tl.float32)
        for block in range(lo, key_end, BLOCK_N):
            keys = block + tl.arange(0, BLOCK_N)
            key_ok = keys < key_end
            pages = tl.load(table + keys // PAGE, mask=key_ok, other=0).to(tl.int64)
            offsets = pages[:, None] * c_p + (keys % PAGE)[:, None] * c_n + kv_head * c_h + dims[None, :] * c_d
            kt = tl.load(k_cache + offsets, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            scores = tl.dot(qt, tl.trans(kt)) * scale
            key_blocks_n = tl.load(key_blocks + block_offset + keys, mask=key_ok, other=-2)
            allowed = keys[None, :] <= positions[:, None]
            allowed |= (query_blocks[:, None] >= 0) & (query_blocks[:, None] == key_blocks_n[None, :])
            allowed &= keys[None, :] > positions[:, None] - window
            allowed &= key_ok[None, :] & row_ok[:, None]
            scores = tl.where(allowed, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(scores - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vt = tl.load(v_cache + offsets, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m_i = m_new
        result = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out + token[:, None] * o_t + head * o_h + dims[None, :] * o_d,
            result.to(out.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )

    return prefill_kernel
