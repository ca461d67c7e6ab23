"""Prefill attention over the paged cache for several chunks at once: the torch reference against an independent
formulation (each chunk's whole-sequence keys from a slot-per-sequence cache, Gemma 3's mask written out), and
the Triton kernel (Triton's interpreter on CPU, fp32) against the reference, on shuffled pages."""

from __future__ import annotations

import subprocess
import sys

import torch

from medgemma_xray.pytorch_backend.prefill_attention import PrefillChunk, PrefillPlan, reference_prefill_attention
from tests.conftest import REPO_ROOT
from tests.pytorch_backend.paged_layout import to_pages


def gemma_mask(start: int, end: int, blocks: list[int], window: int) -> torch.Tensor:
    """Query positions start..end-1 over keys 0..end-1: causal, an image's tokens see all of it, the window."""
    allowed = torch.zeros(end - start, end, dtype=torch.bool)
    for query in range(start, end):
        for key in range(end):
            visible = key <= query or (blocks[query] >= 0 and blocks[query] == blocks[key])
            if window:
                visible = visible and key > query - window
            allowed[query - start, key] = visible
    return allowed


def chunks_with_images() -> list[PrefillChunk]:
    """Three sequences: a first chunk through an image, a later chunk that starts inside an image whose first part
    is cached already, and text alone."""
    image = [-1] * 5 + [0] * 20 + [-1] * 39
    return [PrefillChunk(1, 0, 40, image[:40]), PrefillChunk(0, 12, 64, image), PrefillChunk(2, 0, 7, [-1] * 7)]


def test_reference_applies_gemma_masks_per_chunk_on_their_own_pages():
    torch.manual_seed(3)
    k_slots, v_slots = torch.randn(3, 2, 64, 16), torch.randn(3, 2, 64, 16)
    k_pages, v_pages, tables = to_pages(k_slots, v_slots)
    chunks = chunks_with_images()
    q = torch.randn(sum(c.end - c.start for c in chunks), 4, 16)
    for window in (0, 9):
        produced = reference_prefill_attention(
            q, k_pages, v_pages, tables, PrefillPlan.build(chunks, q.device), window, 0.3
        )
        offset = 0
        for chunk in chunks:
            n = chunk.end - chunk.start
            keys = k_slots[chunk.row, :, : chunk.end].repeat_interleave(2, dim=0)
            values = v_slots[chunk.row, :, : chunk.end].repeat_interleave(2, dim=0)
            scores = torch.einsum("nhd,hkd->hnk", q[offset : offset + n], keys) * 0.3
            scores = scores.masked_fill(~gemma_mask(chunk.start, chunk.end, chunk.blocks, window), float("-inf"))
            expected = torch.einsum("hnk,hkd->nhd", torch.softmax(scores, -1), values)
            assert torch.allclose(produced[offset : offset + n], expected, atol=1e-5)
            offset += n


def test_a_tile_reads_keys_up_to_the_end_of_its_image_only():
    plan = PrefillPlan.build(chunks_with_images(), torch.device("cpu"))
    # chunk 0 (positions 0..39, an image at 5..24): one tile of 32 rows then one of 8; the first reaches the image's end
    assert plan.tile_chunk.tolist()[:2] == [0, 0]
    assert plan.tile_key_end.tolist()[:2] == [32, 40]
    assert plan.tile_key_end.tolist()[2] == 44  # chunk 1 starts at 12: rows 12..43
    assert plan.tile_key_end.tolist()[-1] == 7


KERNEL_CHECK = r"""
import os, torch
os.environ["TRITON_INTERPRET"] = "1"
import triton.runtime.interpreter as interpreter
_patch = interpreter._patch_lang_tensor
def _patch_index(tensor, scope):  # Triton 3.6's interpreter casts 1-element arrays with int(), which numpy 2 refuses
    _patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
interpreter._patch_lang_tensor = _patch_index
from medgemma_xray.pytorch_backend.prefill_attention import PrefillPlan, reference_prefill_attention, triton_prefill_attention
from tests.pytorch_backend.paged_layout import to_pages
from tests.pytorch_backend.test_prefill_attention import chunks_with_images
torch.manual_seed(0)
worst = 0.0
chunks = chunks_with_images()
for heads, kv_heads, dim, window in ((4, 2, 16, 0), (4, 2, 48, 9), (2, 1, 32, 30)):
    k_slots, v_slots = torch.randn(3, kv_heads, 64, dim), torch.randn(3, kv_heads, 64, dim)
    k_pages, v_pages, tables = to_pages(k_slots, v_slots, seed=dim)
    q = torch.randn(sum(c.end - c.start for c in chunks), heads, dim)
    plan = PrefillPlan.build(chunks, q.device)
    expected = reference_prefill_attention(q, k_pages, v_pages, tables, plan, window, 0.3)
    produced = triton_prefill_attention(q, k_pages, v_pages, tables, plan, window, 0.3)
    worst = max(worst, (expected - produced).abs().max().item())
print("WORST", worst)
"""


def test_triton_kernel_matches_the_reference_in_the_interpreter():
    result = subprocess.run(
        [sys.executable, "-c", KERNEL_CHECK], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    worst = float(result.stdout.split("WORST")[1])
    assert worst < 1e-4, worst


def test_triton_kernel_compiles_for_the_h200():
    """Triton compiles the kernel to SM 9.0 code here, without a GPU, at the real head size."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from medgemma_xray.pytorch_backend.decode_attention import PAGE_TOKENS
    from medgemma_xray.pytorch_backend.prefill_attention import BLOCK_M, BLOCK_N, _kernel

    pointers = {"q": "*bf16", "k_cache": "*bf16", "v_cache": "*bf16", "out": "*bf16", "block_tables": "*i32"}
    metadata = dict.fromkeys(("tile_chunk", "tile_first", "tile_key_end", "chunk_meta", "key_blocks"), "*i32")
    strides = ["q_t", "q_h", "q_d", "c_p", "c_n", "c_h", "c_d", "o_t", "o_h", "o_d"]
    signature = {
        **pointers,
        "bt_row": "i32",
        **metadata,
        **dict.fromkeys(strides, "i32"),
        "scale": "fp32",
        "window": "i32",
        "group": "i32",
        **dict.fromkeys(("DIM", "BLOCK_DIM", "BLOCK_M", "BLOCK_N", "PAGE"), "constexpr"),
    }
    sizes = {"DIM": 256, "BLOCK_DIM": 256, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "PAGE": PAGE_TOKENS}
    compiled = triton.compile(
        ASTSource(fn=_kernel(), signature=signature, constexprs=sizes), target=GPUTarget("cuda", 90, 32)
    )
    assert ".target sm_90" in compiled.asm["ptx"]
