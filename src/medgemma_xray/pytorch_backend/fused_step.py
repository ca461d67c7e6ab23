"""The decode step with fewer kernels, and optionally 8-bit weights: a drop-in for PagedGemmaDecoder.decode.

Same math as PagedGemmaDecoder.layer_step (transformers' Gemma 3), over the decoder's own caches, rope tables and
norm weights. What differs:
- the KV write happens inside the attention kernel (decode_attention.write_decode_attention): no index_put
  kernels, one custom op per layer instead of a write plus an attention;
- with weights "int8" or "fp8", every linear of the step, the vocabulary projection included, reads 8-bit weights
  with per-channel scales through medgemma_xray.pytorch_backend.weight_only's fused-dequantisation kernel;
- 8-bit, fewer kernels: at batch 1 the one-row GEMV (split-K partials summed in the
  next norm's kernel; gate/up and GeLU in one kernel); q/k norm and rotary inside the attention kernel; each
  layer's step also computes the next layer's input norm (the final norm after the last layer), in the kernel
  that ends the layer. The bf16 step keeps the current step's arithmetic, so its tokens stay the current ones.
The prefill keeps the decoder's bf16 weights (it is compute-bound; 8 bits would not pay there), so the 8-bit mode
holds both copies: 3.9 GB more for MedGemma-4B. The accuracy gate (weight_gate) measures exactly this pairing.

Each layer type is one compiled graph (tensors and one bool in, as the decoder's own step), so compile costs
seconds and a CUDA graph then captures the whole step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from medgemma_xray.pytorch_backend.decode_attention import write_decode_attention, write_decode_attention_rope
from medgemma_xray.pytorch_backend.weight_only import (
    WEIGHT_FORMATS,
    QuantizedWeight,
    quantize_weight,
    weight_only_gelu_glu,
    weight_only_linear,
    weight_only_linear_reduced,
    weight_only_linear_split,
)

logger = logging.getLogger(__name__)


@torch.library.custom_op("medgemma::write_decode_attention", mutates_args=("k_cache", "v_cache"))
def fused_write_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    window: int,
    scale: float,
) -> torch.Tensor:
    """Write each sequence's new key/value at its position and attend over its filled part, in one kernel."""
    return write_decode_attention(q, k, v, k_cache, v_cache, block_tables, rows, positions, window, scale)


@fused_write_attention.register_fake
def _(q, k, v, k_cache, v_cache, block_tables, rows, positions, window, scale):
    return torch.empty_like(q)


@torch.library.custom_op("medgemma::write_decode_attention_rope", mutates_args=("k_cache", "v_cache"))
def fused_write_attention_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    eps: float,
    window: int,
    scale: float,
) -> torch.Tensor:
    """As fused_write_attention over the raw q/k projections: their per-head norm and rotary inside the kernel."""
    return write_decode_attention_rope(
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
        eps,
        window,
        scale,
    )


@fused_write_attention_rope.register_fake
def _(
    q, k, v, k_cache, v_cache, block_tables, rows, positions, q_norm, k_norm, cos_table, sin_table, eps, window, scale
):
    return torch.empty_like(q)


@dataclass
class StepMatrices:
    """One layer's four matrices in the step's format: bf16 tensors (scales None) or 8-bit data with scales."""

    qkv: torch.Tensor
    qkv_scale: torch.Tensor | None
    o: torch.Tensor
    o_scale: torch.Tensor | None
    gate_up: torch.Tensor
    gate_up_scale: torch.Tensor | None
    down: torch.Tensor
    down_scale: torch.Tensor | None


MATRICES = ("qkv", "o", "gate_up", "down")


class FusedDecodeStep:
    """decode(tokens, positions, rows) -> (ids, logprobs), as PagedGemmaDecoder.decode, over `decoder`'s state."""

    def __init__(
        self,
        decoder,
        weights: str = "bf16",
        compile: bool = False,
        reduce_in_kernel: bool = True,
        split_qkv: bool = False,
    ) -> None:
        """reduce_in_kernel (8-bit, batch 1): the o and down GEMVs sum their split-K partials inside the kernel
        rather than in a separate kernel after it; split_qkv: qkv through the split GEMV too (the earlier
        arrangement, kept to measure against)."""
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"FAST_PATH_WEIGHTS must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
        self.decoder = decoder
        self.weights = weights
        self.reduce_in_kernel = reduce_in_kernel
        self.split_qkv = split_qkv
        self.matrices = [self._matrices(layer) for layer in decoder.layers]
        if weights == "bf16":
            self.lm_head, self.lm_head_scale = decoder.lm_head, None
        else:
            head = quantize_weight(decoder.lm_head, weights)
            self.lm_head, self.lm_head_scale = head.data, head.scale
        # 8-bit: each layer's step also returns the next layer's normed input (the final norm after the last), so
        # that norm joins the kernel that ends the layer instead of opening the next one. bf16 keeps the current
        # step's kernel boundaries, so its tokens stay those of the current step.
        self.chain_norms = weights != "bf16"
        self.layer_step = self._layer_step
        self.sample = self._sample
        self.norm = _rms_norm
        if compile:
            self.compile()

    def compile(self) -> None:
        """One compiled graph per layer type (and batch 1 vs any batch), as the decoder's own step."""
        self.layer_step = torch.compile(self._layer_step, dynamic=True)
        self.sample = torch.compile(self._sample, dynamic=True)
        self.norm = torch.compile(_rms_norm, dynamic=True)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one step reads (the embedding row aside)."""
        tensors = [getattr(m, name) for m in self.matrices for name in MATRICES] + [self.lm_head]
        scales = [getattr(m, f"{name}_scale") for m in self.matrices for name in MATRICES] + [self.lm_head_scale]
        return sum(t.numel() * t.element_size() for t in tensors + [s for s in scales if s is not None])

    def quantized(self) -> dict[str, tuple[torch.Tensor, QuantizedWeight]]:
        """name -> (bf16 weight, its 8-bit form) for every matrix, for the reconstruction check; empty in bf16."""
        if self.weights == "bf16":
            return {}
        found = {
            "lm_head": (
                self.decoder.lm_head,
                QuantizedWeight(self.lm_head, cast(torch.Tensor, self.lm_head_scale), self.weights),
            )
        }  # 8-bit: set
        for index, (layer, matrices) in enumerate(zip(self.decoder.layers, self.matrices, strict=True)):
            for name in MATRICES:
                data, scale = getattr(matrices, name), getattr(matrices, f"{name}_scale")
                found[f"layers.{index}.{name}"] = (getattr(layer, name), QuantizedWeight(data, scale, self.weights))
        return found

    def _matrices(self, layer) -> StepMatrices:
        values = {}
        for name in MATRICES:
            weight = getattr(layer, name)
            if self.weights == "bf16":
                values[name], values[f"{name}_scale"] = weight, None
            else:
                quantized = quantize_weight(weight, self.weights)
                values[name], values[f"{name}_scale"] = quantized.data, quantized.scale
        return StepMatrices(**values)

    # --- the step -------------------------------------------------------------------------------------------------
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor):
        return self.sample(self.hidden(tokens, positions, rows), self.lm_head, self.lm_head_scale, self.chain_norms)

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """float32 (batch, vocab) logits of one step (uncompiled head): what the accuracy gate compares."""
        hidden = self.hidden(tokens, positions, rows)
        return self._logits(hidden, self.lm_head, self.lm_head_scale, self.chain_norms).float()

    def hidden(self, tokens, positions, rows):
        """The last layer's output; with chain_norms, already through the final norm."""
        d = self.decoder
        x = F.embedding(tokens, d.embed.weight) * d.embed_scale
        normed = self.norm(x, d.layers[0].input_norm, d.eps) if self.chain_norms else None
        for index, (layer, m) in enumerate(zip(d.layers, self.matrices, strict=True)):
            next_norm = None
            if self.chain_norms:
                next_norm = d.layers[index + 1].input_norm if index + 1 < len(d.layers) else d.final_norm
            out = self.layer_step(
                x,
                normed,
                next_norm,
                m.qkv,
                m.qkv_scale,
                m.o,
                m.o_scale,
                m.gate_up,
                m.gate_up_scale,
                m.down,
                m.down_scale,
                layer.input_norm,
                layer.post_attention_norm,
                layer.pre_feedforward_norm,
                layer.post_feedforward_norm,
                layer.q_norm,
                layer.k_norm,
                d.k_cache[index],
                d.v_cache[index],
                d.block_tables,
                d.cos[layer.sliding],
                d.sin[layer.sliding],
                positions,
                rows,
                layer.sliding,
            )
            x, normed = out if self.chain_norms else (out, None)
        return normed if self.chain_norms else x

    def _layer_step(
        self,
        x,
        normed,
        next_norm,
        qkv,
        qkv_scale,
        o,
        o_scale,
        gate_up,
        gate_up_scale,
        down,
        down_scale,
        input_norm,
        post_attention_norm,
        pre_feedforward_norm,
        post_feedforward_norm,
        q_norm,
        k_norm,
        k_cache,
        v_cache,
        block_tables,
        cos_table,
        sin_table,
        positions,
        rows,
        sliding: bool,
    ):
        d = self.decoder
        heads, kv_heads, dim, eps = d.heads, d.kv_heads, d.head_dim, d.eps
        batch = x.shape[0]
        one_row = batch == 1 and qkv_scale is not None  # the 8-bit GEMV path (batch is specialised at 1)
        linear = (_linear_reduced if self.reduce_in_kernel else _linear_split) if one_row else _linear
        h = normed if normed is not None else _rms_norm(x, input_norm, eps)
        # qkv unsplit: the H200 profile (2026-12-01) showed the split partials' sum plus one copy each for q, k
        # and v (four kernels a layer) in front of the attention op, and int8 chose no split for it anyway
        qkv_linear = linear if self.split_qkv and one_row else _linear
        q, k, v = qkv_linear(h, qkv, qkv_scale).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        window = d.window if sliding else 0
        q, k, v = q.view(batch, heads, dim), k.view(batch, kv_heads, dim), v.view(batch, kv_heads, dim)
        if qkv_scale is not None:  # 8-bit: q/k norm and rotary inside the attention kernel (two kernels fewer)
            attended = fused_write_attention_rope(
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
                eps,
                window,
                d.scale,
            )
        else:  # bf16: the current step's arithmetic and kernel boundaries, token for token
            cos, sin = cos_table[positions][:, None, :], sin_table[positions][:, None, :]
            q = _rms_norm(q, q_norm, eps)
            k = _rms_norm(k, k_norm, eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            attended = fused_write_attention(q, k, v, k_cache, v_cache, block_tables, rows, positions, window, d.scale)
        x = x + _rms_norm(linear(attended.reshape(batch, -1), o, o_scale), post_attention_norm, eps)
        h = _rms_norm(x, pre_feedforward_norm, eps)
        if one_row:
            activated = weight_only_gelu_glu(h, gate_up, gate_up_scale)  # gate/up and the GeLU in one kernel
        else:
            gate, up = _linear(h, gate_up, gate_up_scale).split(d.intermediate, dim=-1)
            activated = F.gelu(gate, approximate="tanh") * up
        x = x + _rms_norm(linear(activated, down, down_scale), post_feedforward_norm, eps)
        if next_norm is None:
            return x
        return x, _rms_norm(x, next_norm, eps)

    def _logits(self, x, lm_head, lm_head_scale, normed: bool = False):
        d = self.decoder
        logits = _linear(x if normed else _rms_norm(x, d.final_norm, d.eps), lm_head, lm_head_scale)
        if d.softcap:
            logits = torch.tanh(logits / d.softcap) * d.softcap
        return logits

    def _sample(self, x, lm_head, lm_head_scale, normed: bool = False):
        logprobs = torch.log_softmax(self._logits(x, lm_head, lm_head_scale, normed).float(), dim=-1)
        best = logprobs.max(dim=-1)
        return best.indices, best.values


def _linear(x, weight, scale):
    """bf16: the plain product the decoder uses; 8-bit: the fused-dequantisation kernel (an opaque custom op)."""
    if scale is None:
        return x @ weight.T
    return weight_only_linear(x, weight, scale)


def _linear_split(x, weight, scale):
    """8-bit, one row: the split-K GEMV's fp32 partials, summed in the compiled graph (and cast to x's dtype, as
    the unsplit kernel's output). On the H200 Inductor gave the sum a kernel of its own (2026-12-01)."""
    return weight_only_linear_split(x, weight, scale).sum(0).to(x.dtype)


def _linear_reduced(x, weight, scale):
    """8-bit, one row: the split-K GEMV whose last program per column block adds the partials (no sum kernel)."""
    return weight_only_linear_reduced(x, weight, scale)


def _rms_norm(x, weight, eps: float):
    """Gemma's RMSNorm, as static_decoder's: normalise in fp32, scale by (1 + w) in fp32, then cast."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
