"""Weight-only 8-bit linears for the decode step: int8 or FP8 (e4m3) weights with one scale per output channel,
dequantised inside the matrix-vector product.

Why weight-only: at batch 1 a decode step is bound by reading the weights (7.8 GB of bf16 for MedGemma-4B), so
halving those bytes is what pays; the activations stay bf16 and the accumulation fp32. Stock `torch._scaled_mm`
quantises the activations too and needs 16-row padding, which measured no gain on the H200 (DESIGN.md section 3).

Two implementations of one function, y = (x @ q.T) * scale:
- `reference_weight_only_linear`: torch (CPU, and the GPU check's reference);
- `triton_weight_only_linear`: one Triton kernel, grid (output-channel blocks, row blocks); each program streams
  its rows of q once, converts them to the activations' dtype in registers and feeds tl.dot (rows padded to 16),
  then applies the per-channel scale in the epilogue. The same kernel takes bf16 weights with no scale, so the
  benchmark can compare it with cuBLAS on equal terms.
Both are reached through the custom op `medgemma::weight_only_linear`, opaque to torch.compile.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from engine_bundle.defaults import FAST_PATH_WEIGHT_FORMATS

WEIGHT_FORMATS = FAST_PATH_WEIGHT_FORMATS
INT8_MAX = 127.0
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
# The largest relative reconstruction error ||dequantised row - row|| / ||row|| a correct per-channel quantisation
# reaches: int8 rounds to 1/254 of each row's range (about 0.01 for Gaussian rows, a few times that with outliers),
# e4m3 keeps 3 mantissa bits (about 0.03 whatever the range). A wrong scale is off by its own factor (x1.5: 0.5), NaN
# or zero: far above. Per row, so that a broken scale on a small row is not averaged away by the large ones.
MAX_RECONSTRUCTION_ERROR = {"int8": 0.25, "fp8": 0.25}


@dataclass
class QuantizedWeight:
    """An (out, in) weight stored in 8 bits with one float32 scale per output row."""

    data: torch.Tensor  # int8 or float8_e4m3fn, (out, in), contiguous
    scale: torch.Tensor  # float32, (out,)
    format: str

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * 4

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.data.to(torch.float32) * self.scale[:, None]).to(dtype)


def quantize_weight(weight: torch.Tensor, fmt: str, rows_per_chunk: int = 16384) -> QuantizedWeight:
    """Symmetric per-output-channel quantisation; chunked so the vocabulary matrix never needs an fp32 copy."""
    if fmt not in ("int8", "fp8"):
        raise ValueError(f"weight format must be int8 or fp8, got {fmt!r}")
    if fmt == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        raise RuntimeError("FP8 weights need a torch with float8_e4m3fn; use int8")
    limit = INT8_MAX if fmt == "int8" else FP8_MAX
    dtype = torch.int8 if fmt == "int8" else torch.float8_e4m3fn
    data = torch.empty(weight.shape, dtype=dtype, device=weight.device)
    scale = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    with torch.no_grad():
        for start in range(0, weight.shape[0], rows_per_chunk):
            rows = weight[start : start + rows_per_chunk].float()
            row_scale = rows.abs().amax(dim=1).clamp(min=1e-12) / limit
            scaled = rows / row_scale[:, None]
            if fmt == "int8":
                scaled = scaled.round().clamp(-INT8_MAX, INT8_MAX)
            data[start : start + rows_per_chunk] = scaled.to(dtype)
            scale[start : start + rows_per_chunk] = row_scale
    return QuantizedWeight(data, scale, fmt)


def reconstruction_error(weight: torch.Tensor, quantized: QuantizedWeight, rows_per_chunk: int = 16384) -> float:
    """The worst row's ||dequantised - weight|| / ||weight|| (chunked); NaN, inf or non-positive scales give inf."""
    if not torch.isfinite(quantized.scale).all() or not (quantized.scale > 0).all():
        return float("inf")
    worst = 0.0
    with torch.no_grad():
        for start in range(0, weight.shape[0], rows_per_chunk):
            rows = weight[start : start + rows_per_chunk].float()
            data = quantized.data[start : start + rows_per_chunk].float()
            back = data * quantized.scale[start : start + rows_per_chunk, None]
            error = (back - rows).norm(dim=1) / rows.norm(dim=1).clamp(min=1e-30)
            worst = max(worst, float(error.max()))
    return worst


def reference_weight_only_linear(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """x (..., in) @ data.T, times scale per output channel; fp32 accumulation, the result in x's dtype."""
    out = x.float() @ data.float().T
    if scale is not None:
        out = out * scale
    return out.to(x.dtype)


@torch.library.custom_op("medgemma::weight_only_linear", mutates_args=())
def weight_only_linear(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The Triton kernel on CUDA, the torch reference elsewhere. scale: (out,) float32."""
    if x.is_cuda:
        return triton_weight_only_linear(x, data, scale)
    return reference_weight_only_linear(x, data, scale)


@weight_only_linear.register_fake
def _(x, data, scale):
    return x.new_empty((*x.shape[:-1], data.shape[0]))


def triton_weight_only_linear(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    kernels = _kernels()
    rows_in = x.reshape(-1, x.shape[-1])
    m, k = rows_in.shape
    n = data.shape[0]
    if data.shape[1] != k:
        raise ValueError(f"x has {k} features, the weight {data.shape[1]}")
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64

    def grid(meta):
        return (triton_cdiv(n, meta["BLOCK_N"]), triton_cdiv(m, block_m))

    kernels.linear[grid](
        rows_in,
        data,
        scale if scale is not None else out,  # unread when HAS_SCALE is false
        out,
        m,
        n,
        k,
        *rows_in.stride(),
        *data.stride(),
        *out.stride(),
        HAS_SCALE=scale is not None,
        BLOCK_M=block_m,
    )
    return out.reshape(*x.shape[:-1], n)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Block shapes tried per (n, k, row block): a memory-bound GEMV wants every SM streaming, so narrow output blocks
# (many programs) for the 2560-row matrices, wider ones for gate/up and the vocabulary.
CONFIGS = tuple(
    (block_n, block_k, warps, stages)
    for block_n in (16, 32, 64)
    for block_k in (256, 512)
    for warps, stages in ((4, 3), (4, 4), (8, 3))
)


@functools.cache
def _kernels():
    """Compile on first use: importing this module must not need Triton (CPU hosts without it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def linear_kernel(
        x,
        w,
        scale,
        out,
        m,
        n,
        k,
        x_m,
        x_k,
        w_n,
        w_k,
        o_m,
        o_n,
        HAS_SCALE: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        inner = tl.arange(0, BLOCK_K)
        row_ok = rows < m
        col_ok = cols < n
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, k, BLOCK_K):
            ks = start + inner
            k_ok = ks < k
            xt = tl.load(x + rows[:, None] * x_m + ks[None, :] * x_k, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wt = tl.load(w + cols[:, None] * w_n + ks[None, :] * w_k, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc += tl.dot(xt, tl.trans(wt.to(xt.dtype)))
        if HAS_SCALE:
            acc = acc * tl.load(scale + cols, mask=col_ok, other=0.0)[None, :]
        tl.store(
            out + rows[:, None] * o_m + cols[None, :] * o_n,
            acc.to(out.dtype.element_ty),
            mask=row_ok[:, None] & col_ok[None, :],
        )

    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        tuned = triton.heuristics({"BLOCK_N": lambda _: 16, "BLOCK_K": lambda _: 32})(linear_kernel)
    else:
        configs = [
            triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)
            for bn, bk, warps, stages in CONFIGS
        ]
        tuned = triton.autotune(configs, key=["n", "k", "BLOCK_M", "HAS_SCALE"])(linear_kernel)

    class Kernels:
        raw = linear_kernel
        linear = tuned

    return Kernels
