"""Decode attention over the paged cache: the Triton kernel (run by Triton's interpreter on CPU, in fp32) and the
torch reference against a plain masked softmax over each sequence's whole cache, laid out one slot per sequence
(the pages are shuffled, so a read that ignores the block table reads another sequence's keys)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from medgemma_xray.pytorch_backend.decode_attention import reference_decode_attention
from tests.conftest import REPO_ROOT
from tests.pytorch_backend.paged_layout import to_pages


def masked_softmax_attention(q, k_cache, v_cache, slots, lengths, window, scale):
    """Independent formulation: every key of the slot, masked to [length - window, length)."""
    group = q.shape[1] // k_cache.shape[1]
    keys = k_cache[slots].repeat_interleave(group, dim=1).float()  # (batch, heads, max_len, dim)
    values = v_cache[slots].repeat_interleave(group, dim=1).float()
    scores = torch.einsum("bhd,bhnd->bhn", q.float(), keys) * scale
    index = torch.arange(k_cache.shape[2])[None, :]
    visible = index < lengths[:, None]
    if window:
        visible &= index >= (lengths - window)[:, None]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("bhn,bhnd->bhd", torch.softmax(scores, -1), values)


def test_reference_reads_exactly_the_window_of_each_sequence():
    torch.manual_seed(1)
    q = torch.randn(3, 8, 16)
    k_cache, v_cache = torch.randn(5, 4, 64, 16), torch.randn(5, 4, 64, 16)
    k_pages, v_pages, tables = to_pages(k_cache, v_cache)
    rows, lengths = torch.tensor([4, 0, 2]), torch.tensor([1, 64, 17])
    for window in (0, 5, 64):
        expected = masked_softmax_attention(q, k_cache, v_cache, rows, lengths, window, 0.25)
        produced = reference_decode_attention(q, k_pages, v_pages, tables, rows, lengths, window, 0.25)
        assert torch.allclose(produced, expected, atol=1e-5)
    poisoned = k_cache.clone()
    poisoned[0, :, 10:] = float("nan")  # past sequence 0's window: never read
    k_pages, v_pages, tables = to_pages(poisoned, v_cache)
    out = reference_decode_attention(q[:1], k_pages, v_pages, tables, torch.tensor([0]), torch.tensor([10]), 0, 0.25)
    assert torch.isfinite(out).all()


KERNEL_CHECK = r"""
import os, torch
os.environ["TRITON_INTERPRET"] = "1"
import triton.runtime.interpreter as interpreter
_patch = interpreter._patch_lang_tensor
def _patch_index(tensor, scope):  # Triton 3.6's interpreter casts 1-element arrays with int(), which numpy 2 refuses
    _patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
interpreter._patch_lang_tensor = _patch_index
from medgemma_xray.pytorch_backend.decode_attention import reference_decode_attention, triton_decode_attention
from tests.pytorch_backend.paged_layout import to_pages
torch.manual_seed(0)
worst = 0.0
for heads, kv_heads, dim, window, splits in ((4, 2, 32, 0, 3), (8, 4, 64, 20, 2), (2, 2, 16, 0, 1), (8, 1, 32, 7, 4)):
    q = torch.randn(3, heads, dim)
    k_cache, v_cache = torch.randn(4, kv_heads, 96, dim), torch.randn(4, kv_heads, 96, dim)
    k_cache[:, :, 80:] = float("nan")  # never within any length below: a read would poison the output
    k_cache, v_cache, tables = to_pages(k_cache, v_cache)
    rows, lengths = torch.tensor([2, 0, 3]), torch.tensor([1, 70, 33])
    expected = reference_decode_attention(q, k_cache, v_cache, tables, rows, lengths, window, 0.17)
    produced = triton_decode_attention(q, k_cache, v_cache, tables, rows, lengths, window, 0.17, splits=splits)
    worst = max(worst, (expected - produced).abs().max().item())
print("WORST", worst)
"""


def test_triton_kernel_matches_the_reference_in_the_interpreter():
    result = subprocess.run(
        [sys.executable, "-c", KERNEL_CHECK], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    worst = float(result.stdout.split("WORST")[1])
    assert worst < 1e-5, worst


@pytest.mark.parametrize(("write_kv", "norm_rope"), [(False, False), (True, False), (True, True)])
def test_triton_kernels_compile_for_the_h200(write_kv, norm_rope):
    """Triton compiles both kernels to SM 9.0 code here, without a GPU: its interpreter accepts code (a ternary on a
    runtime value, found on the H200) that the compiler refuses. Every variant the steps use: attention alone, with
    the KV write, and with the q/k norm and rotary as well (the 8-bit step)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from medgemma_xray.pytorch_backend.decode_attention import BLOCK_H, BLOCK_N, PAGE_TOKENS, _kernels

    kernels = _kernels()
    strides = ["q_b", "q_h", "q_d", "nk_b", "nk_h", "nk_d", "nv_b", "nv_h", "nv_d"]
    strides += ["c_p", "c_n", "c_h", "c_d", "p_b", "p_h", "p_s", "p_d", "l_b", "l_h", "l_s"]
    partial = {
        "q": "*bf16",
        "k_cache": "*bf16",
        "v_cache": "*bf16",
        "block_tables": "*i32",
        "bt_row": "i32",
        "rows": "*i64",
        "lengths": "*i64",
        "new_k": "*bf16",
        "new_v": "*bf16",
        "partial": "*fp32",
        "lse": "*fp32",
        **dict.fromkeys(strides, "i32"),
        "scale": "fp32",
        "window": "i32",
        "group": "i32",
        "splits": "i32",
        "q_norm": "*bf16",
        "k_norm": "*bf16",
        "cos_table": "*bf16",
        "sin_table": "*bf16",
        "cs_n": "i32",
        "eps": "fp32",
        **dict.fromkeys(("DIM", "BLOCK_DIM", "BLOCK_N", "BLOCK_H", "PAGE", "WRITE_KV", "NORM_ROPE"), "constexpr"),
    }
    merge = {
        "partial": "*fp32",
        "lse": "*fp32",
        "out": "*bf16",
        **dict.fromkeys(["p_b", "p_h", "p_s", "p_d", "l_b", "l_h", "l_s", "o_b", "o_h", "o_d", "splits"], "i32"),
        **dict.fromkeys(("DIM", "BLOCK_DIM", "BLOCK_S"), "constexpr"),
    }
    target = GPUTarget("cuda", 90, 32)
    sizes = {"DIM": 256, "BLOCK_DIM": 256, "BLOCK_N": BLOCK_N, "BLOCK_H": BLOCK_H, "PAGE": PAGE_TOKENS}
    sizes.update(WRITE_KV=write_kv, NORM_ROPE=norm_rope)
    compiled = triton.compile(ASTSource(fn=kernels.partial, signature=partial, constexprs=sizes), target=target)
    assert ".target sm_90" in compiled.asm["ptx"]
    merged = triton.compile(
        ASTSource(fn=kernels.merge, signature=merge, constexprs={"DIM": 256, "BLOCK_DIM": 256, "BLOCK_S": 8}),
        target=target,
    )
    assert "cubin" in merged.asm
