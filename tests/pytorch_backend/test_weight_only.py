"""The 8-bit weight-only linear: quantisation, the Triton kernel (Triton's interpreter on CPU, and compiled for
SM 9.0 without a GPU), and the fused KV-write attention kernel against its reference."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from medgemma_xray.pytorch_backend.weight_only import (
    MAX_RECONSTRUCTION_ERROR,
    quantize_weight,
    reconstruction_error,
    reference_weight_only_linear,
)
from tests.conftest import REPO_ROOT

GEMV_CONSTEXPRS = ["HAS_SCALE", "GLU", "S_MAX", "REDUCE", "MAGIC_I8", "BLOCK_N", "BLOCK_K", "EVEN_K"]


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_per_channel_quantisation_reconstructs_and_a_broken_scale_does_not(fmt):
    torch.manual_seed(0)
    weight = torch.randn(300, 64) * torch.logspace(-3, 0, 300)[:, None]  # rows of very different ranges
    quantized = quantize_weight(weight, fmt, rows_per_chunk=128)
    assert quantized.data.dtype == (torch.int8 if fmt == "int8" else torch.float8_e4m3fn)
    error = reconstruction_error(weight, quantized)
    assert error < 0.05  # int8 about 0.01, e4m3 about 0.03 per row
    x = torch.randn(3, 64)
    produced = reference_weight_only_linear(x, quantized.data, quantized.scale)
    expected = x @ weight.T
    assert ((produced - expected).norm() / expected.norm()) < MAX_RECONSTRUCTION_ERROR[fmt]
    quantized.scale[7] *= 1.5  # a small row: invisible in the whole matrix's norm, not in its own
    assert reconstruction_error(weight, quantized) > MAX_RECONSTRUCTION_ERROR[fmt]
    quantized.scale[7] = float("nan")
    assert reconstruction_error(weight, quantized) == float("inf")


KERNEL_CHECK = r"""
import os, torch
os.environ["TRITON_INTERPRET"] = "1"
import triton.runtime.interpreter as interpreter
_patch = interpreter._patch_lang_tensor
def _patch_index(tensor, scope):  # Triton 3.6's interpreter casts 1-element arrays with int(), which numpy 2 refuses
    _patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
interpreter._patch_lang_tensor = _patch_index
from medgemma_xray.pytorch_backend.weight_only import quantize_weight, reference_weight_only_linear, triton_weight_only_linear
from medgemma_xray.pytorch_backend.decode_attention import reference_write_decode_attention, triton_decode_attention
from medgemma_xray.pytorch_backend.decode_attention import write_decode_attention_rope
from medgemma_xray.pytorch_backend.weight_only import SPLITS, reference_gelu_glu, triton_gemv
from tests.pytorch_backend.paged_layout import to_pages
torch.manual_seed(0)
worst = 0.0
for n, k in ((40, 96), (33, 200), (8, 32)):  # one row: the GEMV, plain, split-K (3 of 8 rows) and gelu-gated
    x = torch.randn(1, k)
    for w in (torch.randn(n, k), torch.randn(2 * n, k)):
        q = quantize_weight(w, "int8")
        expected = reference_weight_only_linear(x, q.data, q.scale)
        poison = torch.full((SPLITS, 1, w.shape[0]), float("nan"))
        partials = triton_gemv(x, q.data, q.scale, split=True)
        assert partials.shape == poison.shape and torch.isfinite(partials).all()
        reduced = triton_gemv(x, q.data, q.scale, reduce=True)  # the splits summed by the last program
        reduced_again = triton_gemv(x, q.data, q.scale, reduce=True)  # the counters were re-armed
        assert torch.equal(reduced, reduced_again)
        for produced in (triton_gemv(x, q.data, q.scale), partials.sum(0), reduced):
            worst = max(worst, ((expected - produced).abs().max() / expected.abs().max()).item())
        expected = reference_weight_only_linear(x, w, None)
        produced = triton_gemv(x, w, None)
        worst = max(worst, ((expected - produced).abs().max() / expected.abs().max()).item())
    expected = reference_gelu_glu(x, q.data, q.scale)
    produced = triton_gemv(x, q.data, q.scale, glu=True)
    assert produced.shape == (1, n)
    worst = max(worst, ((expected - produced).abs().max() / expected.abs().max()).item())
for m, n, k in ((1, 40, 96), (5, 33, 64), (20, 16, 32), (70, 24, 64)):
    x, w = torch.randn(m, k), torch.randn(n, k)
    q = quantize_weight(w, "int8")
    for data, scale in ((q.data, q.scale), (w, None)):
        expected = reference_weight_only_linear(x, data, scale)
        produced = triton_weight_only_linear(x, data, scale)
        worst = max(worst, ((expected - produced).abs().max() / expected.abs().max()).item())
    # the GEMM that serves several rows and the GEMV that serves one give each row the same product
    gemm = triton_weight_only_linear(x, q.data, q.scale)
    for row in range(0, m, max(1, m // 3)):
        gemv = triton_gemv(x[row : row + 1], q.data, q.scale)
        worst = max(worst, ((gemm[row : row + 1] - gemv).abs().max() / gemv.abs().max()).item())
for heads, kv_heads, dim, window, splits in ((4, 2, 32, 0, 3), (8, 4, 64, 20, 2), (8, 1, 32, 7, 4)):
    q = torch.randn(3, heads, dim)
    qkv = torch.randn(3, 2 * kv_heads * dim + 5)  # k and v as strided views, as the step slices them
    k = qkv[:, : kv_heads * dim].view(3, kv_heads, dim)
    v = qkv[:, kv_heads * dim : 2 * kv_heads * dim].view(3, kv_heads, dim)
    k_cache, v_cache = torch.randn(4, kv_heads, 96, dim), torch.randn(4, kv_heads, 96, dim)
    k_cache[:, :, 80:] = float("nan")  # past every position below: a read would poison the output
    k_cache, v_cache, tables = to_pages(k_cache, v_cache)
    rows, positions = torch.tensor([2, 0, 3]), torch.tensor([0, 69, 32])
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    expected = reference_write_decode_attention(q, k, v, k_ref, v_ref, tables, rows, positions, window, 0.17)
    produced = triton_decode_attention(
        q, k_cache, v_cache, tables, rows, positions, window, 0.17, splits, new_k=k, new_v=v
    )
    worst = max(worst, (expected - produced).abs().max().item())
    assert torch.equal(k_cache.nan_to_num(), k_ref.nan_to_num()) and torch.equal(v_cache.nan_to_num(), v_ref.nan_to_num())
    # raw projections: per-head norm and rotary inside the kernel (the 8-bit step), against the torch reference
    q_norm, k_norm = torch.randn(dim) * 0.3, torch.randn(dim) * 0.3
    cos_table, sin_table = torch.randn(96, dim), torch.randn(96, dim)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    args = (tables, rows, positions, q_norm, k_norm, cos_table, sin_table, 1e-6, window, 0.17)
    expected = write_decode_attention_rope(q, k, v, k_ref, v_ref, *args)
    rope = (q_norm, k_norm, cos_table, sin_table, 1e-6)
    produced = triton_decode_attention(
        q, k_cache, v_cache, tables, rows, positions, window, 0.17, splits, new_k=k, new_v=v, rope=rope
    )
    worst = max(worst, (expected - produced).abs().max().item())
    assert torch.allclose(k_cache.nan_to_num(), k_ref.nan_to_num(), atol=1e-5)
print("WORST", worst)
"""


def test_triton_kernels_match_their_references_in_the_interpreter():
    result = subprocess.run(
        [sys.executable, "-c", KERNEL_CHECK], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    worst = float(result.stdout.split("WORST")[1])
    assert worst < 1e-5, worst


@pytest.mark.parametrize("weight_type", ["*i8", "*fp8e4nv", "*bf16"])
def test_weight_only_kernel_compiles_for_the_h200(weight_type):
    """Triton compiles the GEMV to SM 9.0 code here, without a GPU, for each weight format."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from medgemma_xray.pytorch_backend.weight_only import CONFIGS, _kernels

    signature = {
        "x": "*bf16",
        "w": weight_type,
        "scale": "*fp32",
        "out": "*bf16",
        **dict.fromkeys(["m", "n", "k", "x_m", "x_k", "w_n", "w_k", "o_m", "o_n"], "i32"),
        **dict.fromkeys(["HAS_SCALE", "BLOCK_M", "BLOCK_N", "BLOCK_K"], "constexpr"),
    }
    block_n, block_k, warps, stages = CONFIGS[0]
    sizes = {"HAS_SCALE": weight_type != "*bf16", "BLOCK_M": 16, "BLOCK_N": block_n, "BLOCK_K": block_k}
    compiled = triton.compile(
        ASTSource(fn=_kernels().raw, signature=signature, constexprs=sizes),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": warps, "num_stages": stages},
    )
    assert ".target sm_90" in compiled.asm["ptx"]
    assert "cubin" in compiled.asm


@pytest.mark.parametrize("weight_type", ["*i8", "*fp8e4nv", "*bf16"])
@pytest.mark.parametrize("variant", ["plain", "split", "glu", "reduce"])
def test_gemv_kernel_compiles_for_the_h200(weight_type, variant):
    """The one-row GEMV (plain, split-K partials, gelu-gated gate/up, split-K summed in the kernel) compiles to SM 9.0 code for each format, at
    the largest block shape the autotuner may pick, with 16-byte weight loads (ld.global.v4 in the PTX)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from medgemma_xray.pytorch_backend.weight_only import GEMV_BLOCKS, GLU_BLOCKS, SPLITS, _kernels

    signature = {
        "x": "*bf16",
        "w": weight_type,
        "scale": "*fp32",
        "out": "*fp32" if variant == "split" else "*bf16",
        "partials": "*fp32",
        "counters": "*i32",
        **dict.fromkeys(["n", "k", "w_n", "SPLIT"], "i32"),
        **dict.fromkeys(GEMV_CONSTEXPRS, "constexpr"),
    }
    block_n, block_k, warps = GLU_BLOCKS[-1] if variant == "glu" else GEMV_BLOCKS[-1]
    sizes = {
        "HAS_SCALE": weight_type != "*bf16",
        "GLU": variant == "glu",
        "S_MAX": SPLITS if variant == "split" else 1,
        "REDUCE": variant == "reduce",
        "MAGIC_I8": True,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "EVEN_K": True,
    }
    # at run time Triton specialises 16-byte-aligned pointers and multiples of 16 (k = w_n = 2560 etc.) as such
    attrs = {(index,): [["tt.divisibility", 16]] for index in range(9)}
    compiled = triton.compile(
        ASTSource(fn=_kernels().raw_gemv, signature=signature, constexprs=sizes, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": warps},
    )
    assert ".target sm_90" in compiled.asm["ptx"]
    assert "cubin" in compiled.asm

    ptx = compiled.asm["ptx"]
    assert "ld.global.v4.b32" in ptx and "ld.global.b8" not in ptx, "the weight rows must load 16 bytes at a time"
    if variant == "reduce":  # the splits' sum in the kernel: one arrival counter, partials read past L1
        assert "atom.global.gpu.acq_rel.add" in ptx and "ld.global.cg" in ptx


def test_int8_gemv_widens_without_the_conversion_unit(tmp_path):
    """The int8 GEMV's SASS has no I2F (one per weight, a quarter-rate unit, in the kernel measured on the H200 on
    2026-12-01 at ~2.1 TB/s): the weights widen through integer and fp32 adds instead."""
    import os

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from medgemma_xray.pytorch_backend.weight_only import _kernels

    signature = {
        **{"x": "*bf16", "w": "*i8", "scale": "*fp32", "out": "*fp32", "partials": "*fp32", "counters": "*i32"},
        **dict.fromkeys(["n", "k", "w_n", "SPLIT"], "i32"),
        **dict.fromkeys(GEMV_CONSTEXPRS, "constexpr"),
    }
    sizes = {"HAS_SCALE": True, "GLU": False, "S_MAX": 8, "BLOCK_N": 8, "BLOCK_K": 512, "EVEN_K": True}
    sizes.update(REDUCE=False, MAGIC_I8=True)
    compiled = triton.compile(
        ASTSource(fn=_kernels().raw_gemv, signature=signature, constexprs=sizes),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4},
    )
    cubin = tmp_path / "gemv.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert sass.count("FFMA") >= 32  # 8 x 512 weights over 128 threads: 32 products a thread per step
    assert sass.count("I2F") < 8, "one I2F per weight"  # a few remain for the split arithmetic (integer division)
