"""The decode step with fewer kernels, and optionally 8-bit weights: a drop-in for StaticGemmaDecoder.decode.

Same math as StaticGemmaDecoder.layer_step (transformers' Gemma 3), over the decoder's own caches, rope tables and
norm weights. What differs:
- the KV write happens inside the attention kernel (decode_attention.write_decode_attention): no index_put
  kernels, one custom op per layer instead of a write plus an attention;
- with weights "int8" or "fp8", every linear of the step, the vocabulary projection included, reads 8-bit weights
  with per-channel scales through pytorch_backend.weight_only's fused-dequantisation kernel.
The prefill keeps the decoder's bf16 weights (it is compute-bound; 8 bits would not pay there), so the 8-bit mode
holds both copies: 3.9 GB more for MedGemma-4B. The accuracy gate (weight_gate) measures exactly this pairing.

Each layer type is one compiled graph (tensors and one bool in, as the decoder's own step), so compile costs
seconds and a CUDA graph then captures the whole step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pytorch_backend.decode_attention import write_decode_attention
from pytorch_backend.weight_only import WEIGHT_FORMATS, QuantizedWeight, quantize_weight, weight_only_linear

logger = logging.getLogger(__name__)


@torch.library.custom_op("medgemma::write_decode_attention", mutates_args=("k_cache", "v_cache"))
def fused_write_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    window: int,
    scale: float,
) -> torch.Tensor:
    """Write each sequence's new key/value at its position and attend over its filled part, in one kernel."""
    return write_decode_attention(q, k, v, k_cache, v_cache, slots, positions, window, scale)


@fused_write_attention.register_fake
def _(q, k, v, k_cache, v_cache, slots, positions, window, scale):
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
    """decode(tokens, positions, slots) -> (ids, logprobs), as StaticGemmaDecoder.decode, over `decoder`'s state."""

    def __init__(self, decoder, weights: str = "bf16", compile: bool = False) -> None:
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"FAST_PATH_WEIGHTS must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
        self.decoder = decoder
        self.weights = weights
        self.matrices = [self._matrices(layer) for layer in decoder.layers]
        if weights == "bf16":
            self.lm_head, self.lm_head_scale = decoder.lm_head, None
        else:
            head = quantize_weight(decoder.lm_head, weights)
            self.lm_head, self.lm_head_scale = head.data, head.scale
        self.layer_step = self._layer_step
        self.sample = self._sample
        if compile:
            self.compile()

    def compile(self) -> None:
        """One compiled graph per layer type (and batch 1 vs any batch), as the decoder's own step."""
        self.layer_step = torch.compile(self._layer_step, dynamic=True)
        self.sample = torch.compile(self._sample, dynamic=True)

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
        found = {"lm_head": (self.decoder.lm_head, QuantizedWeight(self.lm_head, self.lm_head_scale, self.weights))}
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
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor):
        return self.sample(self.hidden(tokens, positions, slots), self.lm_head, self.lm_head_scale)

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """float32 (batch, vocab) logits of one step (uncompiled head): what the accuracy gate compares."""
        return self._logits(self.hidden(tokens, positions, slots), self.lm_head, self.lm_head_scale).float()

    def hidden(self, tokens, positions, slots):
        d = self.decoder
        x = F.embedding(tokens, d.embed.weight) * d.embed_scale
        for index, (layer, m) in enumerate(zip(d.layers, self.matrices, strict=True)):
            x = self.layer_step(
                x,
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
                d.cos[layer.sliding],
                d.sin[layer.sliding],
                positions,
                slots,
                layer.sliding,
            )
        return x

    def _layer_step(
        self,
        x,
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
        cos_table,
        sin_table,
        positions,
        slots,
        sliding: bool,
    ):
        d = self.decoder
        heads, kv_heads, dim, eps = d.heads, d.kv_heads, d.head_dim, d.eps
        batch = x.shape[0]
        q, k, v = _linear(_rms_norm(x, input_norm, eps), qkv, qkv_scale).split(
            [heads * dim, kv_heads * dim, kv_heads * dim], dim=-1
        )
        cos, sin = cos_table[positions][:, None, :], sin_table[positions][:, None, :]
        q = _rms_norm(q.view(batch, heads, dim), q_norm, eps)
        k = _rms_norm(k.view(batch, kv_heads, dim), k_norm, eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        window = d.window if sliding else 0
        attended = fused_write_attention(
            q, k, v.view(batch, kv_heads, dim), k_cache, v_cache, slots, positions, window, d.scale
        )
        x = x + _rms_norm(_linear(attended.reshape(batch, -1), o, o_scale), post_attention_norm, eps)
        h = _rms_norm(x, pre_feedforward_norm, eps)
        gate, up = _linear(h, gate_up, gate_up_scale).split(d.intermediate, dim=-1)
        return x + _rms_norm(
            _linear(F.gelu(gate, approximate="tanh") * up, down, down_scale), post_feedforward_norm, eps
        )

    def _logits(self, x, lm_head, lm_head_scale):
        d = self.decoder
        logits = _linear(_rms_norm(x, d.final_norm, d.eps), lm_head, lm_head_scale)
        if d.softcap:
            logits = torch.tanh(logits / d.softcap) * d.softcap
        return logits

    def _sample(self, x, lm_head, lm_head_scale):
        logprobs = torch.log_softmax(self._logits(x, lm_head, lm_head_scale).float(), dim=-1)
        best = logprobs.max(dim=-1)
        return best.indices, best.values


def _linear(x, weight, scale):
    """bf16: the plain product the decoder uses; 8-bit: the fused-dequantisation kernel (an opaque custom op)."""
    if scale is None:
        return x @ weight.T
    return weight_only_linear(x, weight, scale)


def _rms_norm(x, weight, eps: float):
    """Gemma's RMSNorm, as static_decoder's: normalise in fp32, scale by (1 + w) in fp32, then cast."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
