"""Prompt rendering and tokenization without torch or transformers: the bundle's tokenizer.json and chat template.

Produces the same ids as the Hugging Face processor (a test checks it): render the Jinja chat template, expand
each <start_of_image> into MedGemma's image sequence, tokenize without adding special tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class BundleText:
    def __init__(self, bundle_dir: Path, image_tokens: int) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        bundle_dir = Path(bundle_dir)
        self.tokenizer = Tokenizer.from_file(str(bundle_dir / "tokenizer.json"))
        config = json.loads((bundle_dir / "tokenizer_config.json").read_text())
        template_file = bundle_dir / "chat_template.jinja"
        template = template_file.read_text() if template_file.is_file() else config["chat_template"]

        def raise_exception(message: str):
            raise ValueError(message)

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        self.template = environment.from_string(template)
        self.special = {key: config[key] for key in ("bos_token", "eos_token", "pad_token") if key in config}
        boi, eoi, image = config["boi_token"], config["eoi_token"], config["image_token"]
        self.boi_token = boi
        self.image_sequence = f"\n\n{boi}{image * image_tokens}{eoi}\n\n"
        self.image_token_id = self.tokenizer.token_to_id(image)

    def render(self, messages: list[dict]) -> str:
        return self.template.render(messages=messages, add_generation_prompt=True, **self.special)

    def encode_chat(self, messages: list[dict]) -> np.ndarray:
        """int64 ids of shape (1, sequence) for the conversation, ready for generation."""
        text = self.render(messages).replace(self.boi_token, self.image_sequence)
        return np.asarray([self.tokenizer.encode(text, add_special_tokens=False).ids], dtype=np.int64)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
