"""Gemma 3's text decoder over a paged KV cache: batched decode steps fed from the device, and packed prefill.

The math is transformers' Gemma3 (RMSNorm with (1 + w) in fp32, q/k norms, rotate-half RoPE with per-layer-type
tables, GELU-tanh MLP, tied lm_head), written against the loaded model's own weights, so the eager model and this
path share one copy of them (q/k/v and gate/up are fused into single matrices, and the model's modules are
re-pointed at views of those).

The state (vLLM's paged attention, SGLang's device-side token map):
- every layer's keys and values live in one pool of pages of PAGE_TOKENS positions; a sequence row's block table
  names its pages, so conversations on one film share the pages of its prompt by reference, and a follow-up writes
  on into its own pages;
- every sequence row keeps its next input token and position on the device (`row_tokens`, `row_positions`): a
  prefill leaves its first answer token there and each decode step its next one, so the host can queue step N+1
  before it has read step N (the scheduler's overlap), and a decode step is one fixed-shape call for any mix of
  rows: what a CUDA graph captures.
Prefill packs the chunks of several prompts along the token axis into one forward (vLLM's varlen batches): the
weights are read once for all of them, and attention is one kernel per layer over every chunk
(prefill_attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from medgemma_xray.pytorch_backend.decode_attention import PAGE_TOKENS, write_decode_attention
from medgemma_xray.pytorch_backend.prefill_attention import PrefillChunk, PrefillPlan, prefill_attention

# A prefill bucket's attention (prefill_static) reads only its own keys, in registers: the memory-efficient kernel
# (cuDNN builds a plan per new shape: 100 ms to 2 s first-token times on the H200, 2026-12-01), or math.
PREFILL_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@torch.library.custom_op("medgemma::paged_decode_attention", mutates_args=("k_cache", "v_cache"))
def cached_decode_attention(
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
    """Write each sequence's new key/value at its position and attend over its filled part: on CUDA one Triton
    launch (the write inside the attention kernel, which reads the new key from registers: the same values a
    separate write would store), plus the split merge. One opaque op, so torch.compile fuses everything around it."""
    return write_decode_attention(q, k, v, k_cache, v_cache, block_tables, rows, positions, window, scale)


@cached_decode_attention.register_fake
def _(q, k, v, k_cache, v_cache, block_tables, rows, positions, window, scale):
    return torch.empty_like(q)


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


class PagedGemmaDecoder:
    def __init__(self, model, rows: int, max_len: int, pages: int) -> None:
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
        self.rows, self.max_len, self.pages = rows, max_len, pages
        self.dummy_row = rows  # padding rows of a captured batch: their own block table, all on the dummy page
        self.dummy_page = pages  # what padding rows and positions past a prompt's end write to
        self.max_pages = -(-max_len // PAGE_TOKENS)
        self.embed = text_model.embed_tokens
        # As the model's embedding module: sqrt(hidden), rounded to the weights' dtype (transformers#29402).
        self.embed_scale = text_model.embed_tokens.embed_scale.to(self.device, self.dtype)
        self.final_norm = text_model.norm.weight
        self.lm_head = model.lm_head.weight
        self.layers = [self._fuse(layer, config.layer_types[index]) for index, layer in enumerate(text_model.layers)]
        self.cos, self.sin = self._rope_tables(text_model.rotary_emb, sorted(set(config.layer_types)))
        shape = (pages + 1, PAGE_TOKENS, self.kv_heads, self.head_dim)
        self.k_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.block_tables = torch.full(
            (rows + 1, self.max_pages), self.dummy_page, dtype=torch.int32, device=self.device
        )
        self.row_tokens = torch.zeros(rows + 1, dtype=torch.long, device=self.device)
        self.row_positions = torch.zeros(rows + 1, dtype=torch.long, device=self.device)

    @property
    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k_cache, *self.v_cache))

    def page_bytes(self) -> int:
        """Bytes of one page: every layer's keys and values for PAGE_TOKENS positions."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * len(self.layers) * self.kv_heads * PAGE_TOKENS * self.head_dim * element

    @staticmethod
    def page_bytes_for(model) -> int:
        config = model.config.get_text_config()
        element = next(model.parameters()).element_size()
        layers = config.num_hidden_layers
        return 2 * layers * config.num_key_value_heads * PAGE_TOKENS * config.head_dim * element

    # --- the page state the host keeps in step ---------------------------------------------------------------------
    def set_tables(self, rows: list[int], tables: torch.Tensor) -> None:
        """Block-table rows (len(rows), max_pages) int32 from the host, queued behind the work already launched."""
        index = _to_device(torch.tensor(rows, dtype=torch.long), self.device)
        self.block_tables.index_copy_(0, index, _to_device(tables, self.device))

    def copy_page(self, source: int, target: int) -> None:
        """Every layer's keys and values of one page into another (copy-on-write of a shared page)."""
        for cache in (*self.k_cache, *self.v_cache):
            cache[target].copy_(cache[source])

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
    def advance(self, step, rows: torch.Tensor):
        """One decode step of `step` (this decoder's `decode`, or an 8-bit step over the same state) for sequence
        rows `rows` (batch,) int64, fed from and written back to the rows' device state. Padding rows name the
        dummy row. Returns (ids, logprobs), each (batch,), on the device. Reads no host value: capturable."""
        tokens, positions = self.row_tokens[rows], self.row_positions[rows]
        ids, logprobs = step(tokens, positions, rows)
        self.row_tokens.index_put_((rows,), ids)
        # Padding rows stay at position 0 of the dummy row: every replay would otherwise move it one on, past the
        # end of its block table and the rotary tables after a few thousand steps.
        following = torch.where(rows == self.dummy_row, torch.zeros_like(positions), positions + 1)
        self.row_positions.index_put_((rows,), following)
        return ids, logprobs

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor):
        """One token for each sequence: tokens, positions, rows are (batch,) int64 on the device.

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
                self.block_tables,
                self.cos[layer.sliding],
                self.sin[layer.sliding],
                positions,
                rows,
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
        block_tables,
        cos_table,
        sin_table,
        positions,
        rows,
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
            q, k, v.view(batch, kv_heads, dim), k_cache, v_cache, block_tables, rows, positions, window, self.scale
        )
        x = x + _rms_norm(attended.reshape(batch, -1) @ o.T, post_attention_norm, eps)
        h = _rms_norm(x, pre_feedforward_norm, eps)
        gate, up = (h @ gate_up.T).split(self.intermediate, dim=-1)
        return x + _rms_norm((F.gelu(gate, approximate="tanh") * up) @ down.T, post_feedforward_norm, eps)

    def sample(self, x):
        logprobs = torch.log_softmax(self._logits(x).float(), dim=-1)
        best = logprobs.max(dim=-1)
        return best.indices, best.values

    def prefill_packed(self, chunks: list[PrefillChunk], embeds: torch.Tensor, write_index: torch.Tensor, logit_chunks):
        """Several prompt chunks in one forward, packed along the token axis (varlen, no padding).

        embeds: (sum of chunk lengths, hidden), the chunks in order; write_index: (same,) int64, the flat cache index
        (page * PAGE_TOKENS + offset) of each token's position, from the host's page lists. The linear layers,
        norms and rotary run once over every token (`prefill_qkv` / `prefill_out`, which warm-up may compile: one
        graph, reused by all layers, dynamic in the token count); each layer writes every chunk's keys and values
        into its pages, then one attention kernel serves every chunk against its own sequence, so chunks never see
        each other. Chunks listed in logit_chunks sample their greedy next token, which is also left in their row's
        device state with the next position (a decode step may follow before the host reads it).
        Returns (ids, logprobs), each (len(logit_chunks),), on the device; None when logit_chunks is empty."""
        last = self._prefill_last_rows(chunks, embeds, write_index, logit_chunks)
        if last is None:
            return None
        logprobs = torch.log_softmax(self._logits(last).float(), dim=-1)
        best = logprobs.max(dim=-1)
        rows = torch.tensor([chunks[i].row for i in logit_chunks])
        next_positions = torch.tensor([chunks[i].end for i in logit_chunks])
        rows, next_positions = _to_device(rows, self.device), _to_device(next_positions, self.device)
        self.row_tokens.index_put_((rows,), best.indices)
        self.row_positions.index_put_((rows,), next_positions)
        return best.indices, best.values

    def prompt_logits(self, chunk: PrefillChunk, embeds: torch.Tensor, write_index: torch.Tensor) -> torch.Tensor:
        """float32 logits (vocab,) after a whole prompt (the precision checks compare distributions)."""
        last = self._prefill_last_rows([chunk], embeds, write_index, [0])
        assert last is not None  # one chunk asked for
        return self._logits(last)[0].float()

    def _prefill_last_rows(self, chunks, embeds, write_index, logit_chunks) -> torch.Tensor | None:
        """The packed forward; the final hidden state of the last token of each chunk in logit_chunks."""
        x = embeds.to(self.dtype)
        positions = torch.cat([torch.arange(c.start, c.end) for c in chunks]).to(self.device, non_blocking=True)
        lone_token = x.shape[0] == 1
        if lone_token:  # a compiler specialises size 1: pad to 2 rows rather than recompile while serving
            x, positions = x.repeat(2, 1), positions.repeat(2)
        plan = PrefillPlan.build(chunks, self.device)
        rope = {sliding: (self.cos[sliding][positions], self.sin[sliding][positions]) for sliding in (False, True)}
        flat_shape = (-1, self.kv_heads, self.head_dim)
        tokens = write_index.shape[0]
        for index, layer in enumerate(self.layers):
            cos, sin = rope[layer.sliding]
            q, k, v = self.prefill_qkv(x, layer.qkv, layer.input_norm, layer.q_norm, layer.k_norm, cos, sin)
            k_cache, v_cache = self.k_cache[index], self.v_cache[index]
            k_cache.view(flat_shape).index_copy_(0, write_index, k[:tokens])
            v_cache.view(flat_shape).index_copy_(0, write_index, v[:tokens])
            window = self.window if layer.sliding else 0
            attended = prefill_attention(q[:tokens], k_cache, v_cache, self.block_tables, plan, window, self.scale)
            attended = attended.reshape(tokens, -1)
            if lone_token:
                attended = attended.repeat(2, 1)
            x = self._layer_rest(x, attended, layer)
        if not logit_chunks:
            return None
        ends, offset = [], 0
        for chunk in chunks:
            offset += chunk.end - chunk.start
            ends.append(offset - 1)
        last_rows = _to_device(torch.tensor([ends[i] for i in logit_chunks]), self.device)
        return x.index_select(0, last_rows)

    def prefill_static(self, x, blocks, row, last_row):
        """A whole prompt from position 0 at a fixed row count (a prefill bucket): what a CUDA graph captures.

        x: (B, hidden) embeddings, the prompt's n rows then padding; blocks: (B,) image block id per row (-1 for
        text and padding); row: (1,) int64, the sequence row (its block table covers positions 0..n-1); last_row:
        (1,) int64, n - 1. Rows past n are causal after every prompt row, so no prompt row sees them, and their
        keys/values go to the dummy page. No host value is read: nothing here syncs. Leaves the greedy next token
        and position n in the row's device state; returns (that token (1,), its log-probability (1,))."""
        count = x.shape[0]
        positions = torch.arange(count, device=x.device)
        masks = {sliding: self._static_mask(positions, count, blocks, sliding) for sliding in (False, True)}
        rope = {sliding: (self.cos[sliding][:count], self.sin[sliding][:count]) for sliding in (False, True)}
        # block_tables[row][0], not block_tables[row[0]]: a 0-dim tensor index is read on the host (a sync, which
        # invalidates a graph capture)
        pages = self.block_tables[row][0][positions // PAGE_TOKENS].long()
        pages = torch.where(positions <= last_row, pages, torch.full_like(pages, self.dummy_page))
        write_index = pages * PAGE_TOKENS + positions % PAGE_TOKENS
        flat_shape = (-1, self.kv_heads, self.head_dim)
        group = self.heads // self.kv_heads
        for index, layer in enumerate(self.layers):
            cos, sin = rope[layer.sliding]
            q, k, v = self.prefill_qkv(x, layer.qkv, layer.input_norm, layer.q_norm, layer.k_norm, cos, sin)
            self.k_cache[index].view(flat_shape).index_copy_(0, write_index, k)
            self.v_cache[index].view(flat_shape).index_copy_(0, write_index, v)
            # from position 0, this prompt's keys are all the keys: no read back from the cache
            keys = k.transpose(0, 1)[None].repeat_interleave(group, dim=1)
            values = v.transpose(0, 1)[None].repeat_interleave(group, dim=1)
            with sdpa_kernel(PREFILL_ATTENTION):
                attended = F.scaled_dot_product_attention(
                    q.transpose(0, 1)[None], keys, values, attn_mask=masks[layer.sliding], scale=self.scale
                )
            x = self._layer_rest(x, attended[0].transpose(0, 1).reshape(count, -1), layer)
        logprobs = torch.log_softmax(self._logits(x.index_select(0, last_row)).float(), dim=-1)
        best = logprobs.max(dim=-1)
        self.row_tokens.index_put_((row,), best.indices)
        self.row_positions.index_put_((row,), last_row + 1)
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

    def _static_mask(self, positions, end: int, blocks, sliding: bool) -> torch.Tensor:
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


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on the device, queued behind the launched work (pinned, so the copy is asynchronous)."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
