"""The incremental decoder against decoding all ids at once, on the demo tokenizer (byte-level BPE, with
multi-byte characters split across tokens)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medgemma_xray.inference_api.decoding import IncrementalDecoder


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))


def deltas(tokenizer, ids: list[int]) -> list[str]:
    decoder = IncrementalDecoder(lambda window: tokenizer.decode(window, skip_special_tokens=True))
    out = [decoder.push(token) for token in ids]
    return [*out, decoder.flush()]


def test_text_with_multibyte_characters_arrives_whole(tokenizer):
    text = "Pleural effusion — 2 cm, no pneumothorax; CTR 0.55 (≈ normal). Ü ß é 肺"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = deltas(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)  # a character is never emitted half-decoded
    assert sum(1 for piece in pieces if piece) > len(text) // 8  # it streams, it does not wait for the end


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(min_value=0, max_value=900), min_size=1, max_size=40))
def test_concatenated_deltas_equal_decoding_everything(tokenizer, ids):
    """Any id sequence, special tokens and ids past the vocabulary included (a random model emits those)."""
    assert "".join(deltas(tokenizer, ids)) == tokenizer.decode(ids, skip_special_tokens=True)
