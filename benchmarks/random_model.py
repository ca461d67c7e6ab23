"""A full-size MedGemma-4B-shaped model with random weights, built on the device, so anyone can measure the real
cost of an answer without the real weights (which cannot be downloaded here).

Sizes are google/medgemma-4b-it's published ones (DESIGN.md section 2). The tokenizer and processor are the demo
checkpoint's (its special-token ids are put into the config), so prompts render with Gemma 3's chat template; the
vocabulary matrix is full size (262208 rows), so the lm_head costs what it really costs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

logger = logging.getLogger(__name__)

MEDGEMMA_4B_TEXT = dict(
    hidden_size=2560,
    intermediate_size=10240,
    num_hidden_layers=34,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    vocab_size=262208,
    sliding_window=1024,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
)
MEDGEMMA_4B_VISION = dict(
    hidden_size=1152,
    intermediate_size=4304,
    num_hidden_layers=27,
    num_attention_heads=16,
    image_size=896,
    patch_size=14,
    vision_use_head=False,
)


def random_medgemma_4b(processor_dir: Path, device: str, seed: int = 0):
    """(model, processor) on `device` in bf16 (fp32 on CPU). Stop tokens get zero logits, so every answer runs to
    its token limit, as a benchmark needs; the projector is random, not transformers' zeros."""
    import torch
    from transformers import AutoProcessor, Gemma3Config, Gemma3ForConditionalGeneration

    started = time.perf_counter()
    processor = AutoProcessor.from_pretrained(processor_dir)
    tokenizer = processor.tokenizer
    special = {
        name: tokenizer.convert_tokens_to_ids(token)
        for name, token in (
            ("boi", "<start_of_image>"),
            ("eoi", "<end_of_image>"),
            ("image", "<image_soft_token>"),
            ("eos", "<eos>"),
            ("eot", "<end_of_turn>"),
            ("bos", "<bos>"),
            ("pad", "<pad>"),
        )
    }
    config = Gemma3Config(
        text_config=dict(
            MEDGEMMA_4B_TEXT, bos_token_id=special["bos"], eos_token_id=special["eos"], pad_token_id=special["pad"]
        ),
        vision_config=MEDGEMMA_4B_VISION,
        mm_tokens_per_image=256,
        boi_token_index=special["boi"],
        eoi_token_index=special["eoi"],
        image_token_index=special["image"],
        eos_token_id=[special["eos"], special["eot"]],
    )
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(seed)
    with torch.device(device):
        model = Gemma3ForConditionalGeneration(config)
    model = model.to(dtype).eval()
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        for token in ("eos", "eot", "pad"):
            embeddings[special[token]].zero_()
        projector = model.model.multi_modal_projector.mm_input_projection_weight
        projector.normal_(mean=0.0, std=0.02)
    model.generation_config.eos_token_id = config.eos_token_id
    logger.info("random MedGemma-4B shape on %s in %.1f s", device, time.perf_counter() - started)
    return model, processor
