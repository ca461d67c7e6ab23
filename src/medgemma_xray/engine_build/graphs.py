"""The three graphs of an engine bundle, as torch modules ready for ONNX export.

vision:  pixel_values (B,3,896,896) -> image_embeds (B,256,H): SigLIP tower + Gemma 3 projector
embed:   input_ids (B,S) -> inputs_embeds (B,S,H): scaled token embeddings (the image rows are replaced
         by image_embeds in the runtime; image tokens are one contiguous run of 256)
decoder: inputs_embeds, position_ids, full_mask, sliding_mask, past KV per layer (batch, kv_heads, capacity,
         head_dim) -> last-token logits, and per layer the KV rows of the new tokens only (batch, kv_heads, new,
         head_dim). Masks are inputs (see masks.py) over capacity + new keys; capacity >= 1 (dead slot). The
         runtime keeps the cache and writes the new rows in (engine_bundle/kv_layout.py says why).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

OPSET = 18


@dataclass(frozen=True)
class DecoderShape:
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    sliding_window: int

    @classmethod
    def from_config(cls, config) -> DecoderShape:
        text = config.get_text_config()
        return cls(
            layers=text.num_hidden_layers,
            kv_heads=text.num_key_value_heads,
            head_dim=text.head_dim,
            hidden=text.hidden_size,
            vocab=text.vocab_size,
            sliding_window=text.sliding_window,
        )

    def kv_names(self, prefix: str) -> list[str]:
        return [f"{prefix}_{kind}_{layer}" for layer in range(self.layers) for kind in ("key", "value")]


class VisionGraph(nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        features = self.model.get_image_features(pixel_values=pixel_values)
        return getattr(features, "pooler_output", features)


class EmbedGraph(nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.embed = model.get_input_embeddings()  # Gemma3TextScaledWordEmbedding: lookup * sqrt(hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)


class DecoderGraph(nn.Module):
    """Gemma 3's text model over a past it does not copy: attention reads the past and the new rows separately.

    transformers' DynamicCache concatenates past and new into one tensor per layer, which ONNX export turns into a
    Concat of the whole past every step, returned as `present` (format 1). Here a cache of new rows only
    (_NewRowsCache) hands each layer its new keys and values, and an attention function registered with
    transformers (_attention_over_past_and_new) scores the past and the new keys in two products, concatenating
    only the scores (1/head_dim the size of the keys), and sums the two weighted values. The same arithmetic as
    transformers' eager attention, in another order of summation; parity.py measures the difference.
    """

    def __init__(self, model) -> None:
        super().__init__()
        self.text_model = model.model.language_model
        self.lm_head = model.lm_head
        text_config = model.config.get_text_config()
        self.softcap = getattr(text_config, "final_logit_softcapping", None)
        self.layers = text_config.num_hidden_layers

    def forward(self, inputs_embeds, position_ids, full_mask, sliding_mask, *past):
        cache = _NewRowsCache()
        config = self.text_model.config
        saved = config._attn_implementation
        config._attn_implementation = _register_split_attention()  # only while this graph runs (restored below)
        try:
            output = self.text_model(
                inputs_embeds=inputs_embeds,
                position_ids=position_ids,
                attention_mask={"full_attention": full_mask, "sliding_attention": sliding_mask},
                past_key_values=cache,
                use_cache=True,
                past_rows=past,
            )
        finally:
            config._attn_implementation = saved
        logits = self.lm_head(output.last_hidden_state[:, -1:, :])
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        presents = []
        for layer in range(self.layers):
            presents += list(cache.new_rows[layer])
        return (logits, *presents)


class _NewRowsCache:
    """What Gemma 3's attention layers ask of a cache (update), keeping only each layer's new keys and values."""

    def __init__(self) -> None:
        self.new_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.new_rows[layer_idx] = (key_states, value_states)
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:  # position_ids are always given; never asked for
        raise NotImplementedError("the decoder graph takes explicit position_ids")


SPLIT_ATTENTION = "medgemma_past_and_new"


def _register_split_attention() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(SPLIT_ATTENTION, _attention_over_past_and_new)
    return SPLIT_ATTENTION


def _attention_over_past_and_new(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, past_rows=(), **kwargs
):
    """Eager attention over [past rows, new rows] without concatenating them.

    Query head h uses KV head h // groups (transformers' repeat_kv). Rather than repeating the keys (a copy of the
    past), the query is regrouped as (batch, kv_heads, groups, new, dim) against keys (batch, kv_heads, 1, rows,
    dim): a MatMul that broadcasts the keys over the groups. On a decode step each product then has one query row,
    which ONNX Runtime's CPU GEMM (MLAS) runs straight from the keys where they lie; with two or more rows it
    first packs (copies) the whole past into its own layout.
    """
    past_key, past_value = past_rows[2 * module.layer_idx], past_rows[2 * module.layer_idx + 1]
    batch, heads, new, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, new, dim)
    scores = torch.cat(
        [
            torch.matmul(grouped, past_key.unsqueeze(2).transpose(3, 4)),
            torch.matmul(grouped, key.unsqueeze(2).transpose(3, 4)),
        ],
        dim=-1,
    )
    scores = scores.reshape(batch, heads, new, -1) * (scaling if scaling is not None else dim**-0.5)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = weights.reshape(batch, kv_heads, heads // kv_heads, new, -1)
    capacity = past_key.shape[2]
    output = torch.matmul(weights[..., :capacity], past_value.unsqueeze(2)) + torch.matmul(
        weights[..., capacity:], value.unsqueeze(2)
    )
    return output.reshape(batch, heads, new, dim).transpose(1, 2).contiguous(), None


def export_graphs(
    model, output_dir, sample_pixels: torch.Tensor, progress=None, graphs=("vision", "embed", "decoder")
) -> dict[str, str]:
    """Export vision, embed and decoder graphs (fp32) to output_dir. Returns {graph: file name}."""
    from pathlib import Path

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    shape = DecoderShape.from_config(model.config)
    files = {}
    with torch.inference_mode():
        if "vision" in graphs:
            _export(
                VisionGraph(model),
                (sample_pixels,),
                output_dir / "vision.onnx",
                ["pixel_values"],
                ["image_embeds"],
                {"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}},
            )
            files["vision"] = "vision.onnx"
            if progress:
                progress("vision")
        if "decoder" not in graphs:
            return files
        device = sample_pixels.device
        ids = torch.tensor([[2, 4, 5, 6]], dtype=torch.long, device=device)
        _export(
            EmbedGraph(model),
            (ids,),
            output_dir / "embed.onnx",
            ["input_ids"],
            ["inputs_embeds"],
            {"input_ids": {0: "batch", 1: "sequence"}, "inputs_embeds": {0: "batch", 1: "sequence"}},
        )
        files["embed"] = "embed.onnx"
        if progress:
            progress("embed")
        decoder_inputs = sample_decoder_inputs(shape, batch=1, new=3, past=2, dtype=next(model.parameters()).dtype)
        decoder_inputs = {name: value.to(device) for name, value in decoder_inputs.items()}
        input_names = ["inputs_embeds", "position_ids", "full_mask", "sliding_mask", *shape.kv_names("past")]
        output_names = ["logits", *shape.kv_names("present")]
        axes = {
            "inputs_embeds": {0: "batch", 1: "sequence"},
            "position_ids": {0: "batch", 1: "sequence"},
            "full_mask": {0: "batch", 2: "sequence", 3: "total"},
            "sliding_mask": {0: "batch", 2: "sequence", 3: "total"},
            "logits": {0: "batch"},
        }
        for name in shape.kv_names("past"):
            axes[name] = {0: "batch", 2: "capacity"}
        for name in shape.kv_names("present"):
            axes[name] = {0: "batch", 2: "sequence"}  # the new tokens' rows only (format 2)
        _export(
            DecoderGraph(model),
            tuple(decoder_inputs.values()),
            output_dir / "decoder.onnx",
            input_names,
            output_names,
            axes,
        )
        files["decoder"] = "decoder.onnx"
        if progress:
            progress("decoder")
    return files


def sample_decoder_inputs(shape: DecoderShape, batch: int, new: int, past: int, dtype=torch.float32) -> dict:
    """Random but well-formed decoder inputs (past includes the dead slot)."""
    import numpy as np

    from medgemma_xray.engine_bundle.masks import attention_masks

    generator = torch.Generator().manual_seed(0)
    positions = np.arange(past - 1, past - 1 + new)[None].repeat(batch, 0)
    keys = np.concatenate([[-1], np.arange(past - 1 + new)])[None].repeat(batch, 0)
    full, sliding = attention_masks(positions, keys, shape.sliding_window)
    inputs = {
        "inputs_embeds": torch.randn(batch, new, shape.hidden, generator=generator, dtype=torch.float32).to(dtype),
        "position_ids": torch.from_numpy(positions).long(),
        "full_mask": torch.from_numpy(full).to(dtype),
        "sliding_mask": torch.from_numpy(sliding).to(dtype),
    }
    for name in shape.kv_names("past"):
        value = torch.randn(batch, shape.kv_heads, past, shape.head_dim, generator=generator) * 0.1
        value[:, :, 0] = 0  # dead slot
        inputs[name] = value.to(dtype)
    return inputs


def _export(module, args, path, input_names, output_names, dynamic_axes) -> None:
    """TorchScript export: measured exact here on Gemma 3 (ORT parity ~1e-6).

    Exported into a scratch folder first: past 2 GB torch writes one external file per tensor; the bundle gets
    one graph file plus, for large graphs, one '<graph>.onnx.data' file.
    """
    import tempfile
    from pathlib import Path

    import onnx

    module.eval()
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as scratch:
        scratch_path = Path(scratch) / path.name
        torch.onnx.export(
            module,
            args,
            str(scratch_path),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
        model = onnx.load(str(scratch_path), load_external_data=True)
        weight_bytes = sum(len(tensor.raw_data) for tensor in model.graph.initializer)
        if weight_bytes > 1_800_000_000:
            onnx.save_model(
                model,
                str(path),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=f"{path.name}.data",
                size_threshold=1024,
            )
        else:
            onnx.save_model(model, str(path))
