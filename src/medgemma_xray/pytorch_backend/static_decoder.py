"""Gemma 3's text decoder over a slotted static KV cache: batched decode steps and chunked prefill.

The math is transformers' Gemma3 (RMSNorm with (1 + w) in fp32, q/k norms, rotate-half RoPE with per-layer-type
tables, GELU-tanh MLP, tied lm_head), written against the loaded model's own weights, so the eager model and this
path share one copy of them (q/k/v and gate/up are fused into single matrices, and the model's modules are
re-pointed at views of those). What differs is the state: every conversation owns one slot of one preallocated
cache, so a decode step is one fixed-shape call for any mix of sequences: what a CUDA graph can capture. Prefill
packs the chunks of several prompts along the token axis into one forward (vLLM's varlen batches): the weights are
read once for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from medgemma_xray.pytorch_backend.decode_attention import decode_attention

# Prefill shapes differ for every prompt. cuDNN's attention builds a plan per new shape (the suspected cause of
# 100 ms to 2 s first-token times on the H200, 2026-12-01), so prefill uses the memory-efficient kernel, or math.
PREFILL_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@torch.library.custom_op("medgemma::decode_attention", mutates_args=("k_cache", "v_cache"))
def cached_decode_attention(
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
    """Write each sequence's new key/value at its position, then attend over its filled part. One opaque op, so
    torch.compile fuses everything around it and the kernel keeps its own launch."""
    k_cache[slots, :, positions] = k
    v_cache[slots, :, positions] = v
    return decode_attention(q, k_cache, v_cache, slots, positions + 1, window, scale)


@cached_decode_attention.register_fake
def _(q, k, v, k_cache, v_cache, slots, positions, window, scale):
    return torch.empty_like(q)


@dataclass
class PrefillSegment:
    """One prompt chunk of a packed prefill: positions start..end-1 of `slot`; blocks: (end,) image block ids of
    every key (-1 for text), so image tokens attend to their whole image."""

    slot: int
    start: int
    end: int
    blocks: torch.Tensor


@dataclass
class LayerWeights:
    qkv: torch.Tensor  # (heads*dim + 2*kv_heads*dim, hidden)
    o: torch.Tensor
    gate_up: torch.Tensor  # (2*intermediate, hidden)
    down: torch.Tensor
    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    pre_feedforward_norm: torch.Tensor
    post_feedforward_norm: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    sliding: bool


class StaticGemmaDecoder:
    def __init__(self, model, slots: int, max_len: int) -> None:
        text_model = model.model.language_model
        config = model.config.get_text_config()
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.hidden = config.head_dim, config.hidden_size
        self.intermediate = config.intermediate_size
        self.eps = config.rms_norm_eps
        self.scale = config.query_pre_attn_scalar**-0.5
        self.window = config.sliding_window
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.slots, self.max_len = slots, max_len
        self.dummy_slot = slots  # padding rows of a captured batch write here, never into a conversation
        self.embed = text_model.embed_tokens
        # As the model's embedding module: sqrt(hidden), rounded to the weights' dtype (transformers#29402).
        self.embed_scale = text_model.embed_tokens.embed_scale.to(self.device, self.dtype)
        self.final_norm = text_model.norm.weight
        self.lm_head = model.lm_head.weight
        self.layers = [self._fuse(layer, config.layer_types[index]) for index, layer in enumerate(text_model.layers)]
        self.cos, self.sin = self._rope_tables(text_model.rotary_emb, sorted(set(config.layer_types)))
        shape = (slots + 1, self.kv_heads, max_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]

        self.k_pool: list[torch.Tensor] = []
        self.v_pool: list[torch.Tensor] = []
        self.block_tokens = 16

    @property
    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k_cache, *self.v_cache))

    # --- the prefix block pool: KV of common prompt prefixes, shared by copy-on-admit -------------------------------
    def block_bytes(self, block_tokens: int) -> int:
        """Bytes of one pool block: every layer's keys and values for block_tokens tokens."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * len(self.layers) * self.kv_heads * block_tokens * self.head_dim * element

    def allocate_prefix_pool(self, blocks: int, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        shape = (blocks, self.kv_heads, block_tokens, self.head_dim)
        self.k_pool = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers] if blocks else []
        self.v_pool = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers] if blocks else []

    def load_prefix(self, slot: int, pool_ids: list[int], length: int) -> None:
        """Copy pool blocks (in order) into `slot` at positions 0..; positions past `length` are overwritten by the
        prefill that follows before anything reads them."""
        ids = torch.tensor(pool_ids, device=self.device)
        tokens = len(pool_ids) * self.block_tokens
        for pool, cache in ((self.k_pool, self.k_cache), (self.v_pool, self.v_cache)):
            for layer_pool, layer_cache in zip(pool, cache, strict=True):
                blocks = layer_pool.index_select(0, ids)  # (n, kv_heads, B, dim)
                layer_cache[slot, :, :tokens] = blocks.transpose(0, 1).reshape(self.kv_heads, tokens, self.head_dim)

    def save_prefix(self, slot: int, pairs: list[tuple[int, int]]) -> None:
        """Copy `slot`'s prompt block `index` into pool block `pool_id`, for each (index, pool_id)."""
        size = self.block_tokens
        indices = torch.tensor([index for index, _ in pairs], device=self.device)
        targets = torch.tensor([pool_id for _, pool_id in pairs], device=self.device)
        positions = (indices[:, None] * size + torch.arange(size, device=self.device)[None]).flatten()
        for pool, cache in ((self.k_pool, self.k_cache), (self.v_pool, self.v_cache)):
            for layer_pool, layer_cache in zip(pool, cache, strict=True):
                rows = layer_cache[slot].index_select(1, positions)  # (kv_heads, n*B, dim)
                rows = rows.view(self.kv_heads, len(pairs), size, self.head_dim).transpose(0, 1)
                layer_pool.index_copy_(0, targets, rows.contiguous())

    # --- weights ----------------------------------------------------------------------------------------------
    def _fuse(self, layer, layer_type: str) -> LayerWeights:
        """One matrix for q/k/v and one for gate/up; the model's Linear modules become views of them."""
        attention, mlp = layer.self_attn, layer.mlp
        qkv = _fused([attention.q_proj, attention.k_proj, attention.v_proj])
        gate_up = _fused([mlp.gate_proj, mlp.up_proj])
        return LayerWeights(
            qkv=qkv,
            o=attention.o_proj.weight,
            gate_up=gate_up,
            down=mlp.down_proj.weight,
            input_norm=layer.input_layernorm.weight,
            post_attention_norm=layer.post_attention_layernorm.weight,
            pre_feedforward_norm=layer.pre_feedforward_layernorm.weight,
            post_feedforward_norm=layer.post_feedforward_layernorm.weight,
            q_norm=attention.q_norm.weight,
            k_norm=attention.k_norm.weight,
            sliding=layer_type == "sliding_attention",
        )

    def _rope_tables(self, rotary, layer_types: list[str]) -> tuple[dict, dict]:
        """cos/sin for every position, per layer type, exactly as the model's rotary module computes them."""
        positions = torch.arange(self.max_len, device=self.device)[None]
        probe = torch.empty(1, device=self.device, dtype=self.dtype)
        cos, sin = {}, {}
        with torch.no_grad():
            for layer_type in layer_types:
                c, s = rotary(probe, positions, layer_type)
                cos[layer_type == "sliding_attention"], sin[layer_type == "sliding_attention"] = c[0], s[0]
        return cos, sin

    # --- the step -------------------------------------------------------------------------------------------------
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor):
        """One token for each sequence: tokens, positions, slots are (batch,) int64 on the device.

        Returns (next token ids (batch,) int64, their log-probabilities (batch,) float32), both on the device.
        `layer_step` and `sample` may be replaced by compiled versions: each is one compiled graph reused by every
        layer (per layer type), so compiling costs seconds, not minutes; a CUDA graph then captures the whole step."""
        x = F.embedding(tokens, self.embed.weight) * self.embed_scale
        for index, layer in enumerate(self.layers):
            x = self.layer_step(
                x,
                layer.qkv,
                layer.o,
                layer.gate_up,
                layer.down,
                layer.input_norm,
                layer.post_attention_norm,
                layer.pre_feedforward_norm,
                layer.post_feedforward_norm,
                layer.q_norm,
                layer.k_norm,
                self.k_cache[index],
                self.v_cache[index],
                self.cos[layer.sliding],
                self.sin[layer.sliding],
                positions,
                slots,
                layer.sliding,
            )
        return self.sample(x)

    def layer_step(
        self,
        x,
        qkv,
        o,
        gate_up,
        down,
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
        """One decoder layer for a batch of single tokens; tensors only (plus one bool), so one compiled graph
        serves every layer of a type."""
        heads, kv_heads, dim, eps = self.heads, self.kv_heads, self.head_dim, self.eps
        batch = x.shape[0]
        q, k, v = (_rms_norm(x, input_norm, eps) @ qkv.T).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        cos, sin = cos_table[positions][:, None, :], sin_table[positions][:, None, :]
        q = _rms_norm(q.view(batch, heads, dim), q_norm, eps)
        k = _rms_norm(k.view(batch, kv_heads, dim), k_norm, eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        window = self.window if sliding else 0
        attended = cached_decode_attention(
            q, k, v.view(batch, kv_heads, dim), k_cache, v_cache, slots, positions, window, self.scale
        )
        x = x + _rms_norm(attended.reshape(batch, -1) @ o.T, post_attention_norm, eps)
        h = _rms_norm(x, pre_feedforward_norm, eps)
        gate, up = (h @ gate_up.T).split(self.intermediate, dim=-1)
        return x + _rms_norm((F.gelu(gate, approximate="tanh") * up) @ down.T, post_feedforward_norm, eps)

    def sample(self, x):
        logprobs = torch.log_softmax(self._logits(x).float(), dim=-1)
        best = logprobs.max(dim=-1)
        return best.indices, best.values

    def prefill(self, slot: int, embeds: torch.Tensor, start: int, blocks: torch.Tensor) -> torch.Tensor:
        """Run embeds (1, n, hidden) at positions start..start+n-1 into `slot`; return the last position's logits.

        blocks: (start+n,) image block id of every key (-1 for text): image tokens attend to their whole image."""
        segment = PrefillSegment(slot, start, start + embeds.shape[1], blocks)
        return self.prefill_packed([segment], embeds[0], [0])

    def prefill_packed(self, segments: list[PrefillSegment], embeds: torch.Tensor, logit_segments: list[int]):
        """Several prompt chunks in one forward, packed along the token axis (varlen, no padding).

        embeds: (sum of chunk lengths, hidden), the chunks in `segments` order. The linear layers, norms and rotary
        run once over every token (`prefill_qkv` / `prefill_out`, which warm-up may compile: one graph, reused by all
        layers, dynamic in the token count); attention runs per chunk against its own slot, so chunks never see
        each other. Returns the logits (len(logit_segments), vocab) of the last token of each listed segment."""
        x = embeds.to(self.dtype)
        positions = torch.cat([torch.arange(s.start, s.end, device=self.device) for s in segments])
        lone_token = x.shape[0] == 1
        if lone_token:  # a compiler specialises size 1: pad to 2 rows rather than recompile while serving
            x, positions = x.repeat(2, 1), positions.repeat(2)
        bounds, offset = [], 0
        for segment in segments:
            bounds.append((offset, offset + segment.end - segment.start))
            offset += segment.end - segment.start
        masks = [
            {sliding: self._prefill_mask(positions[a:b], s.end, s.blocks, sliding) for sliding in (False, True)}
            for s, (a, b) in zip(segments, bounds, strict=True)
        ]
        rope = {sliding: (self.cos[sliding][positions], self.sin[sliding][positions]) for sliding in (False, True)}
        group = self.heads // self.kv_heads
        for index, layer in enumerate(self.layers):
            cos, sin = rope[layer.sliding]
            q, k, v = self.prefill_qkv(x, layer.qkv, layer.input_norm, layer.q_norm, layer.k_norm, cos, sin)
            k_cache, v_cache = self.k_cache[index], self.v_cache[index]
            outputs = []
            for segment, (a, b), mask in zip(segments, bounds, masks, strict=True):
                slot, first, last = segment.slot, segment.start, segment.end
                k_cache[slot, :, first:last] = k[a:b].transpose(0, 1)
                v_cache[slot, :, first:last] = v[a:b].transpose(0, 1)
                keys = k_cache[slot : slot + 1, :, :last].repeat_interleave(group, dim=1)
                values = v_cache[slot : slot + 1, :, :last].repeat_interleave(group, dim=1)
                with sdpa_kernel(PREFILL_ATTENTION):
                    attended = F.scaled_dot_product_attention(
                        q[a:b].transpose(0, 1)[None], keys, values, attn_mask=mask[layer.sliding], scale=self.scale
                    )  # (1, heads, n, dim)
                outputs.append(attended[0].transpose(0, 1).reshape(b - a, -1))
            attended = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
            if lone_token:
                attended = attended.repeat(2, 1)
            x = self._layer_rest(x, attended, layer)
        last_rows = torch.tensor([bounds[i][1] - 1 for i in logit_segments], device=self.device)
        return self._logits(x[last_rows])

    def prefill_static(self, x, blocks, slot, last_row):
        """A whole prompt from position 0 at a fixed row count (a prefill bucket): what a CUDA graph captures.

        x: (B, hidden) embeddings, the prompt's n rows then padding; blocks: (B,) image block id per row (-1 for
        text and padding); slot: (1,) int64; last_row: (1,) int64, n - 1. Rows past n are causal after every
        prompt row, so no prompt row sees them; they write keys/values at positions n..B-1 of the slot, which the
        decode steps overwrite before anything reads them. No host value is read: nothing here syncs.
        Returns (the greedy next token (1,), its log-probability (1,)) on the device."""
        rows = x.shape[0]
        positions = torch.arange(rows, device=x.device)
        masks = {sliding: self._prefill_mask(positions, rows, blocks, sliding) for sliding in (False, True)}
        rope = {sliding: (self.cos[sliding][:rows], self.sin[sliding][:rows]) for sliding in (False, True)}
        group = self.heads // self.kv_heads
        for index, layer in enumerate(self.layers):
            cos, sin = rope[layer.sliding]
            q, k, v = self.prefill_qkv(x, layer.qkv, layer.input_norm, layer.q_norm, layer.k_norm, cos, sin)
            self.k_cache[index][slot, :, positions] = k
            self.v_cache[index][slot, :, positions] = v
            # from position 0, this prompt's keys are all the keys: no read back from the cache
            keys = k.transpose(0, 1)[None].repeat_interleave(group, dim=1)
            values = v.transpose(0, 1)[None].repeat_interleave(group, dim=1)
            with sdpa_kernel(PREFILL_ATTENTION):
                attended = F.scaled_dot_product_attention(
                    q.transpose(0, 1)[None], keys, values, attn_mask=masks[layer.sliding], scale=self.scale
                )
            x = self._layer_rest(x, attended[0].transpose(0, 1).reshape(rows, -1), layer)
        logprobs = torch.log_softmax(self._logits(x.index_select(0, last_row)).float(), dim=-1)
        best = logprobs.max(dim=-1)
        return best.indices, best.values

    def prefill_qkv(self, x, qkv, input_norm, q_norm, k_norm, cos, sin):
        """Normed, rotated q (n, heads, dim), k and v (n, kv_heads, dim) for n packed tokens."""
        heads, kv_heads, dim, eps = self.heads, self.kv_heads, self.head_dim, self.eps
        n = x.shape[0]
        q, k, v = (_rms_norm(x, input_norm, eps) @ qkv.T).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        q = _rms_norm(q.view(n, heads, dim), q_norm, eps)
        k = _rms_norm(k.view(n, kv_heads, dim), k_norm, eps)
        cos, sin = cos[:, None, :], sin[:, None, :]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v.view(n, kv_heads, dim)

    def _layer_rest(self, x, attended, layer):
        """prefill_out with the layer's weights passed one by one: a compiled prefill_out sees tensors only."""
        return self.prefill_out(
            x,
            attended,
            layer.o,
            layer.post_attention_norm,
            layer.gate_up,
            layer.down,
            layer.pre_feedforward_norm,
            layer.post_feedforward_norm,
        )

    def prefill_out(self, x, attended, o, post_attention_norm, gate_up, down, pre_feedforward_norm, post_ff_norm):
        """The rest of a layer for n packed tokens: output projection and the MLP, each with its residual."""
        eps = self.eps
        x = x + _rms_norm(attended @ o.T, post_attention_norm, eps)
        h = _rms_norm(x, pre_feedforward_norm, eps)
        gate, up = (h @ gate_up.T).split(self.intermediate, dim=-1)
        return x + _rms_norm((F.gelu(gate, approximate="tanh") * up) @ down.T, post_ff_norm, eps)

    def _prefill_mask(self, positions, end: int, blocks, sliding: bool) -> torch.Tensor:
        keys = torch.arange(end, device=self.device)
        allowed = keys[None, :] <= positions[:, None]
        query_blocks = blocks[positions]
        allowed |= (query_blocks[:, None] >= 0) & (query_blocks[:, None] == blocks[None, :end])
        if sliding:
            allowed &= keys[None, :] > positions[:, None] - self.window
        return allowed[None, None]

    def _logits(self, x):
        logits = _rms_norm(x, self.final_norm, self.eps) @ self.lm_head.T
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _fused(linears) -> torch.Tensor:
    fused = torch.cat([linear.weight.detach() for linear in linears], dim=0).contiguous()
    offset = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight = torch.nn.Parameter(fused[offset : offset + rows], requires_grad=False)
        offset += rows
    return fused


def _rms_norm(x, weight, eps: float):
    """Gemma's RMSNorm: normalise in fp32, scale by (1 + w) in fp32, then cast (transformers#29402)."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
