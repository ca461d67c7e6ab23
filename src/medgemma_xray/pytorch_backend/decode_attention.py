"""Decode-step attention over a paged KV cache that reads only each sequence's filled part.

The cache of one layer is a pool of pages (shape: pages x PAGE_TOKENS x kv_heads x head_dim, vLLM's layout); each
sequence row has a block table (rows x max_pages, int32) naming the page that holds each run of PAGE_TOKENS
positions, so sequences on one film share the pages of its prompt by reference. This reads only keys
[start, length) of each sequence, where start = length - window for sliding layers.

Two implementations of the same function:
- `reference_decode_attention`: torch, one sequence at a time (CPU, and the GPU check's reference);
- `triton_decode_attention`: a split-K flash-decoding kernel (the approach of vLLM's and SGLang's decode kernels):
  grid (batch, kv head, split); the query heads that share a kv head are one tile, padded to 16 rows so tl.dot
  runs on tensor cores; a second kernel merges the splits by log-sum-exp. Lengths are read on the device, so the
  launch is capturable in a CUDA graph and needs no host sync.
Both take float32 softmax statistics; q, k and v stay in the model's dtype.
"""

from __future__ import annotations

import functools
import math

import torch

PAGE_TOKENS = 16  # positions per KV page (vLLM's default block size; the prefix cache's block)
BLOCK_N = 32  # keys per inner step
BLOCK_H = 16  # query heads per tile (padded): tl.dot needs at least 16 rows


def paged_positions(block_tables: torch.Tensor, row: int, start: int, end: int) -> torch.Tensor:
    """Flat indices (page * PAGE_TOKENS + offset) of positions start..end-1 of a sequence row: index a cache viewed
    as (pages * PAGE_TOKENS, kv_heads, dim)."""
    positions = torch.arange(start, end, device=block_tables.device)
    pages = block_tables[row, positions // PAGE_TOKENS].long()
    return pages * PAGE_TOKENS + positions % PAGE_TOKENS


def gather_keys(cache: torch.Tensor, block_tables: torch.Tensor, row: int, start: int, end: int) -> torch.Tensor:
    """(kv_heads, end - start, dim): a sequence's cached keys (or values) at positions start..end-1."""
    flat = cache.view(-1, cache.shape[2], cache.shape[3])
    return flat[paged_positions(block_tables, row, start, end)].transpose(0, 1)


def reference_decode_attention(
    q, k_cache, v_cache, block_tables, rows, lengths, window: int, scale: float
) -> torch.Tensor:
    """q: (batch, heads, dim); caches: (pages, PAGE_TOKENS, kv_heads, dim); block_tables: (rows, max_pages) int32;
    rows, lengths: (batch,) int64.

    Returns (batch, heads, dim): softmax(q k^T * scale) v over keys [max(0, length - window), length) of each
    sequence (window 0: all of them)."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    for index, (row, length) in enumerate(zip(rows.tolist(), lengths.tolist(), strict=True)):
        start = max(0, length - window) if window else 0
        keys = gather_keys(k_cache, block_tables, row, start, length).float().repeat_interleave(group, dim=0)
        values = gather_keys(v_cache, block_tables, row, start, length).float().repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hnd->hn", q[index].float(), keys) * scale
        out[index] = torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=-1), values).to(q.dtype)
    return out


def triton_decode_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    rows,
    lengths,
    window: int,
    scale: float,
    splits: int = 8,
    new_k=None,
    new_v=None,
    rope=None,
):
    """new_k, new_v: (batch, kv_heads, dim) or None. Given, `lengths` holds each sequence's new position (length - 1)
    and the kernel also writes them into each sequence's slot at
    position length - 1 (the KV write fused into attention: no separate index_put kernels), and attends to them
    from registers, so no program ever depends on another program's store.

    rope: (q_norm, k_norm, cos_table, sin_table, eps) or None. Given (with new_k), q and new_k are the raw
    projections: the kernel applies Gemma's per-head RMSNorm and the rotary embedding at the new position itself
    (norm_rope_reference's arithmetic), so the step needs no separate norm/rotary kernels for q and k."""
    kernels = _kernels()
    write = new_k is not None
    if rope is not None and not write:
        raise ValueError("the fused norm/rotary needs the new keys (new_k, new_v)")
    if rope is not None:
        q_norm, k_norm, cos_table, sin_table, eps = rope
    else:
        q_norm, k_norm, cos_table, sin_table, eps = q, q, q, q, 0.0  # unread unless NORM_ROPE
    if write and (new_k.shape != (q.shape[0], k_cache.shape[2], q.shape[2]) or new_v.shape != new_k.shape):
        raise ValueError(
            f"new keys/values must be (batch, kv_heads, dim), got {tuple(new_k.shape)}, {tuple(new_v.shape)}"
        )
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    if k_cache.shape[1] != PAGE_TOKENS:
        raise ValueError(f"the cache's pages hold {k_cache.shape[1]} positions; the kernel reads {PAGE_TOKENS}")
    if group > BLOCK_H:
        raise ValueError(f"{group} query heads per kv head; the kernel tiles at most {BLOCK_H}")
    partial = torch.empty((batch, heads, splits, dim), device=q.device, dtype=torch.float32)
    lse = torch.empty((batch, heads, splits), device=q.device, dtype=torch.float32)
    kernels.partial[(batch, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        block_tables.stride(0),
        rows,
        lengths,
        new_k if write else q,  # unread unless WRITE_KV
        new_v if write else q,
        partial,
        lse,
        *q.stride(),
        *(new_k.stride() if write else (0, 0, 0)),
        *(new_v.stride() if write else (0, 0, 0)),
        *k_cache.stride(),
        *partial.stride(),
        *lse.stride(),
        scale,
        window if window > 0 else 1 << 30,
        group,
        splits,
        q_norm,
        k_norm,
        cos_table,
        sin_table,
        cos_table.stride(0) if rope is not None else 0,
        eps,
        DIM=dim,
        BLOCK_DIM=triton_next_power_of_2(dim),
        BLOCK_N=BLOCK_N,
        BLOCK_H=BLOCK_H,
        PAGE=PAGE_TOKENS,
        WRITE_KV=write,
        NORM_ROPE=rope is not None,
    )
    out = torch.empty_like(q)
    kernels.merge[(batch, heads)](
        partial,
        lse,
        out,
        *partial.stride(),
        *lse.stride(),
        *out.stride(),
        splits,
        DIM=dim,
        BLOCK_DIM=triton_next_power_of_2(dim),
        BLOCK_S=triton_next_power_of_2(splits),
    )
    return out


def triton_next_power_of_2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


@functools.cache
def _kernels():
    """Compile on first use: importing this module must not need Triton (CPU hosts without it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def partial_kernel(
        q,
        k_cache,
        v_cache,
        block_tables,
        bt_row,
        rows,
        lengths,
        new_k,
        new_v,
        partial,
        lse,
        q_b,
        q_h,
        q_d,
        nk_b,
        nk_h,
        nk_d,
        nv_b,
        nv_h,
        nv_d,
        c_p,
        c_n,
        c_h,
        c_d,
        p_b,
        p_h,
        p_s,
        p_d,
        l_b,
        l_h,
        l_s,
        scale,
        window,
        group,
        splits,
        q_norm,
        k_norm,
        cos_table,
        sin_table,
        cs_n,
        eps,
        DIM: tl.constexpr,
        BLOCK_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_H: tl.constexpr,
        PAGE: tl.constexpr,
        WRITE_KV: tl.constexpr,
        NORM_ROPE: tl.constexpr,
    ):
        b = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        table = block_tables + tl.load(rows + b) * bt_row
        length = tl.load(lengths + b)
        if WRITE_KV:
            length = length + 1  # the caller passed positions: the new key makes the sequence one longer
        start = tl.maximum(length - window, 0)  # the wrapper passes a huge window for full attention
        span = length - start
        per_split = tl.cdiv(tl.cdiv(span, splits), BLOCK_N) * BLOCK_N
        lo = start + split * per_split
        hi = tl.minimum(lo + per_split, length)
        rows = tl.arange(0, BLOCK_H)
        dims = tl.arange(0, BLOCK_DIM)
        head = kv_head * group + rows
        row_ok = rows < group
        dim_ok = dims < DIM
        qt = tl.load(
            q + b * q_b + head[:, None] * q_h + dims[None, :] * q_d, mask=row_ok[:, None] & dim_ok[None, :], other=0.0
        )
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DIM], tl.float32)
        base = kv_head * c_h
        last = length - 1
        if WRITE_KV:
            k_new = tl.load(new_k + b * nk_b + kv_head * nk_h + dims * nk_d, mask=dim_ok, other=0.0)
            v_new = tl.load(new_v + b * nv_b + kv_head * nv_h + dims * nv_d, mask=dim_ok, other=0.0)
        if NORM_ROPE:
            # rotate_half(x)[d] = -x[d + DIM/2] for d < DIM/2, else x[d - DIM/2]: load the partner element directly
            partner = (dims + DIM // 2) % DIM
            sign = tl.where(dims < DIM // 2, -1.0, 1.0)
            cos = tl.load(cos_table + last * cs_n + dims, mask=dim_ok, other=0.0).to(tl.float32)
            sin = tl.load(sin_table + last * cs_n + dims, mask=dim_ok, other=0.0).to(tl.float32)
            q_pair = tl.load(
                q + b * q_b + head[:, None] * q_h + partner[None, :] * q_d,
                mask=row_ok[:, None] & dim_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            qf = qt.to(tl.float32)
            q_inv = tl.rsqrt(tl.sum(qf * qf, 1) / DIM + eps)
            q_w = 1.0 + tl.load(q_norm + dims, mask=dim_ok, other=0.0).to(tl.float32)
            q_w_pair = 1.0 + tl.load(q_norm + partner, mask=dim_ok, other=0.0).to(tl.float32)
            q_n = (qf * q_inv[:, None] * q_w[None, :]).to(qt.dtype).to(tl.float32)
            q_n_pair = (q_pair * q_inv[:, None] * q_w_pair[None, :]).to(qt.dtype).to(tl.float32)
            qt = (q_n * cos[None, :] + sign[None, :] * q_n_pair * sin[None, :]).to(qt.dtype)
            k_pair = tl.load(new_k + b * nk_b + kv_head * nk_h + partner * nk_d, mask=dim_ok, other=0.0).to(tl.float32)
            kf = k_new.to(tl.float32)
            k_inv = tl.rsqrt(tl.sum(kf * kf, 0) / DIM + eps)
            k_w = 1.0 + tl.load(k_norm + dims, mask=dim_ok, other=0.0).to(tl.float32)
            k_w_pair = 1.0 + tl.load(k_norm + partner, mask=dim_ok, other=0.0).to(tl.float32)
            k_n = (kf * k_inv * k_w).to(k_new.dtype).to(tl.float32)
            k_n_pair = (k_pair * k_inv * k_w_pair).to(k_new.dtype).to(tl.float32)
            k_new = (k_n * cos + sign * k_n_pair * sin).to(k_new.dtype)
        if WRITE_KV:
            owner = (last >= lo) & (last < hi)  # exactly one split of this (sequence, kv head) holds the new key
            at = tl.load(table + last // PAGE).to(tl.int64) * c_p + (last % PAGE) * c_n + base
            tl.store(k_cache + at + dims * c_d, k_new.to(k_cache.dtype.element_ty), mask=dim_ok & owner)
            tl.store(v_cache + at + dims * c_d, v_new.to(v_cache.dtype.element_ty), mask=dim_ok & owner)
        for block in range(lo, hi, BLOCK_N):
            keys = block + tl.arange(0, BLOCK_N)
            key_ok = keys < hi
            pages = tl.load(table + keys // PAGE, mask=key_ok, other=0).to(tl.int64)
            offsets = base + pages[:, None] * c_p + (keys % PAGE)[:, None] * c_n + dims[None, :] * c_d
            kt = tl.load(k_cache + offsets, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            if WRITE_KV:
                kt = tl.where((keys == last)[:, None], k_new.to(kt.dtype)[None, :], kt)
            scores = tl.dot(qt, tl.trans(kt)) * scale
            scores = tl.where(key_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vt = tl.load(v_cache + offsets, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            if WRITE_KV:
                vt = tl.where((keys == last)[:, None], v_new.to(vt.dtype)[None, :], vt)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m_i = m_new
        has_keys = l_i > 0
        out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        tl.store(
            partial + b * p_b + head[:, None] * p_h + split * p_s + dims[None, :] * p_d,
            out,
            mask=row_ok[:, None] & dim_ok[None, :],
        )
        tl.store(
            lse + b * l_b + head * l_h + split * l_s,
            tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf")),
            mask=row_ok,
        )

    @triton.jit
    def merge_kernel(
        partial,
        lse,
        out,
        p_b,
        p_h,
        p_s,
        p_d,
        l_b,
        l_h,
        l_s,
        o_b,
        o_h,
        o_d,
        splits,
        DIM: tl.constexpr,
        BLOCK_DIM: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):
        b = tl.program_id(0)
        head = tl.program_id(1)
        s = tl.arange(0, BLOCK_S)
        dims = tl.arange(0, BLOCK_DIM)
        s_ok = s < splits
        dim_ok = dims < DIM
        lse_s = tl.load(lse + b * l_b + head * l_h + s * l_s, mask=s_ok, other=float("-inf"))
        top = tl.max(lse_s, 0)
        weights = tl.where(s_ok, tl.exp(lse_s - top), 0.0)
        values = tl.load(
            partial + b * p_b + head * p_h + s[:, None] * p_s + dims[None, :] * p_d,
            mask=s_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )
        merged = tl.sum(values * weights[:, None], 0) / tl.sum(weights, 0)
        tl.store(out + b * o_b + head * o_h + dims * o_d, merged.to(out.dtype.element_ty), mask=dim_ok)

    class Kernels:
        partial = partial_kernel
        merge = merge_kernel

    return Kernels


def write_positions(k_cache, v_cache, block_tables, rows, positions, k, v) -> None:
    """Store k, v (batch, kv_heads, dim) at each sequence row's position (torch indexing: CPU and references)."""
    pages = block_tables[rows, positions // PAGE_TOKENS].long()
    flat = pages * PAGE_TOKENS + positions % PAGE_TOKENS
    k_cache.view(-1, k_cache.shape[2], k_cache.shape[3])[flat] = k.to(k_cache.dtype)
    v_cache.view(-1, v_cache.shape[2], v_cache.shape[3])[flat] = v.to(v_cache.dtype)


def reference_write_decode_attention(
    q, k, v, k_cache, v_cache, block_tables, rows, positions, window: int, scale: float
):
    """Write k, v (batch, kv_heads, dim) at each sequence's position, then attend over [.., position]."""
    write_positions(k_cache, v_cache, block_tables, rows, positions, k, v)
    return reference_decode_attention(q, k_cache, v_cache, block_tables, rows, positions + 1, window, scale)


def norm_rope_reference(x, norm_weight, cos_table, sin_table, positions, eps: float):
    """Gemma's per-head RMSNorm then the rotary embedding at each sequence's position; x: (batch, heads, dim)."""
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + norm_weight.float())).to(x.dtype)
    cos, sin = cos_table[positions][:, None, :].float(), sin_table[positions][:, None, :].float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-normed[..., half:], normed[..., :half]), dim=-1).float()
    return (normed.float() * cos + rotated * sin).to(x.dtype)


def write_decode_attention_rope(
    q,
    k,
    v,
    k_cache,
    v_cache,
    block_tables,
    rows,
    positions,
    q_norm,
    k_norm,
    cos_table,
    sin_table,
    eps: float,
    window,
    scale,
):
    """write_decode_attention over raw q/k projections: their norm and rotary inside the kernel on CUDA."""
    if q.is_cuda:
        rope = (q_norm, k_norm, cos_table, sin_table, eps)
        return triton_decode_attention(
            q, k_cache, v_cache, block_tables, rows, positions, window, scale, new_k=k, new_v=v, rope=rope
        )
    q = norm_rope_reference(q, q_norm, cos_table, sin_table, positions, eps)
    k = norm_rope_reference(k, k_norm, cos_table, sin_table, positions, eps)
    return reference_write_decode_attention(q, k, v, k_cache, v_cache, block_tables, rows, positions, window, scale)


def write_decode_attention(
    q, k, v, k_cache, v_cache, block_tables, rows, positions, window: int, scale: float
) -> torch.Tensor:
    """The KV write and the attention in one kernel launch (plus the split merge) on CUDA; the reference elsewhere."""
    if q.is_cuda:
        return triton_decode_attention(
            q, k_cache, v_cache, block_tables, rows, positions, window, scale, new_k=k, new_v=v
        )
    return reference_write_decode_attention(q, k, v, k_cache, v_cache, block_tables, rows, positions, window, scale)


def decode_attention(q, k_cache, v_cache, block_tables, rows, lengths, window: int, scale: float) -> torch.Tensor:
    """The Triton kernel on CUDA, the torch reference elsewhere."""
    if q.is_cuda:
        return triton_decode_attention(q, k_cache, v_cache, block_tables, rows, lengths, window, scale)
    return reference_decode_attention(q, k_cache, v_cache, block_tables, rows, lengths, window, scale)
