"""Generate the demo checkpoint: Gemma 3 architecture and config keys, MedGemma's image geometry, tiny sizes.

The weights are random (seeded), so answers mean nothing; the checkpoint exists so that the real loading
path (AutoProcessor + Gemma3ForConditionalGeneration) runs on any CPU with no download.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from medgemma_xray.demo_model import DEMO_MODEL_ID
from medgemma_xray.demo_model.chat_template import GEMMA3_CHAT_TEMPLATE
from medgemma_xray.demo_model.corpus import RADIOLOGY_CORPUS
from medgemma_xray.pytorch_backend.checkpoint import DEMO_MARKER

logger = logging.getLogger(__name__)

# Gemma's own order for the first ids (pad 0, eos 1, bos 2, unk 3), then the chat and image markers.
SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
]
TOKEN_ID = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
VOCAB_TARGET = 2048
SEED = 20261201

# MedGemma-4B keeps these: 896-px SigLIP with patch 14, 256 image tokens, 5 local : 1 global attention.
TEXT_CONFIG = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    sliding_window=512,
    layer_types=["sliding_attention", "full_attention"],
    max_position_embeddings=8192,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
)
VISION_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=896,
    patch_size=14,
    vision_use_head=False,
)


def build_tokenizer(corpus_lines: list[str] | None = None, vocab_size: int = VOCAB_TARGET, split_digits: bool = False):
    """Byte-level BPE trained deterministically on `corpus_lines` (default: radiology text), carrying Gemma 3's
    special tokens. split_digits: every digit its own token, as Gemma's tokenizer does (a box coordinate is then
    written digit by digit, the same way for every value, which a small model learns far more easily than merged
    digit groups that differ from number to number)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = RADIOLOGY_CORPUS.splitlines() if corpus_lines is None else corpus_lines
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
            "start_of_turn_token": "<start_of_turn>",
            "end_of_turn_token": "<end_of_turn>",
        },
        chat_template=GEMMA3_CHAT_TEMPLATE,
        padding_side="left",
    )


def build_config(vocab_size: int, text_config: dict = TEXT_CONFIG, vision_config: dict = VISION_CONFIG):
    from transformers import Gemma3Config

    text = dict(text_config, vocab_size=vocab_size, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    return Gemma3Config(
        text_config=text,
        vision_config=vision_config,
        mm_tokens_per_image=256,
        boi_token_index=TOKEN_ID["<start_of_image>"],
        eoi_token_index=TOKEN_ID["<end_of_image>"],
        image_token_index=TOKEN_ID["<image_soft_token>"],
        # transformers 5.17's Gemma3Config signature leaves out the PretrainedConfig kwargs it accepts (and keeps)
        eos_token_id=[TOKEN_ID["<eos>"], TOKEN_ID["<end_of_turn>"]],
    )


def build_model(config, seed: int = SEED):
    import torch
    from transformers import Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Random weights would stop at a random step (EOS is as likely as any token). Zeroing the
        # stop tokens' tied embeddings gives them logit 0, below the maximum of the random logits,
        # so the demo answers at full length instead of sometimes answering nothing.
        embeddings = model.get_input_embeddings().weight
        for token in ("<eos>", "<end_of_turn>", "<pad>"):
            embeddings[TOKEN_ID[token]].zero_()
        # transformers initialises the projector to zeros, which would make every film look the same to the
        # model. A random projection at the text embeddings' scale makes answers depend on the image.
        projector = model.model.multi_modal_projector.mm_input_projection_weight
        projector.normal_(mean=0.0, std=0.05, generator=torch.Generator().manual_seed(seed + 1))
    return model


def build_processor(tokenizer):
    """MedGemma's processor settings: 896 px, bilinear, rescale 1/255, mean = std = 0.5, no pan-and-scan."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    image_processor = Gemma3ImageProcessorPil(
        size={"height": 896, "width": 896},
        resample=2,  # bilinear, as MedGemma's preprocessor_config.json
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        rescale_factor=1 / 255,
        do_pan_and_scan=False,
    )
    return Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=GEMMA3_CHAT_TEMPLATE, image_seq_length=256
    )


def save_checkpoint(model, processor, output_dir: Path, marker: dict) -> Path:
    """Model, processor and the demo marker (what makes the app label it a demo) into output_dir."""
    from transformers import GenerationConfig

    output_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=2, pad_token_id=0, eos_token_id=model.config.eos_token_id, do_sample=False, max_new_tokens=300
    )
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    (output_dir / DEMO_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return output_dir


def write_demo_checkpoint(output_dir: Path) -> Path:
    """Write the checkpoint into output_dir (created) and return it. Same output for the same versions."""
    tokenizer = build_tokenizer()
    config = build_config(vocab_size=len(tokenizer))
    model = build_model(config)
    marker = {
        "model_id": DEMO_MODEL_ID,
        "warning": "Demo checkpoint with random weights: its answers mean nothing. Not for clinical use.",
        "seed": SEED,
    }
    save_checkpoint(model, build_processor(tokenizer), output_dir, marker)
    logger.info("wrote demo checkpoint (random weights) to %s", output_dir)
    return output_dir


def is_demo_checkpoint(model_dir: Path) -> bool:
    return (Path(model_dir) / DEMO_MARKER).is_file()


def ensure_demo_checkpoint(output_dir: Path) -> Path:
    """Build the checkpoint once; later calls reuse it. Writes to a temporary folder, then renames."""
    output_dir = Path(output_dir)
    if is_demo_checkpoint(output_dir):
        return output_dir
    staging = output_dir.with_name(f".{output_dir.name}.{os.getpid()}.tmp")
    write_demo_checkpoint(staging)
    try:
        staging.rename(output_dir)
    except OSError:  # another process finished first
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        if not is_demo_checkpoint(output_dir):
            raise
    return output_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("models/medgemma-demo"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ensure_demo_checkpoint(args.output)
    print(f"demo checkpoint ready at {args.output} (random weights, answers mean nothing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
