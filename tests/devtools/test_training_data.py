"""Training batches: the processor's own tokenisation, loss on answer tokens only, a pure function of (seed, step)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from devtools.demo_checkpoint.build import build_processor, build_tokenizer
from devtools.demo_checkpoint.dataset import (
    IGNORE_INDEX,
    ConversationTokeniser,
    TeachingData,
    chat,
    tokenizer_corpus,
)
from devtools.phantom_eval import TRAIN_SEED_BASE


@pytest.fixture(scope="module")
def processor():
    return build_processor(build_tokenizer(tokenizer_corpus(200), vocab_size=1024))


def test_tokenisation_matches_the_processor_given_the_film(processor):
    """The shortcut (film processed once, text expanded by hand) gives exactly the ids the serving path gets."""
    tokeniser = ConversationTokeniser(processor)
    image = Image.new("RGB", (64, 64))
    turns = [("Is there a pleural effusion?", "No pleural effusion."), ("Is there a pacemaker?", None)]
    messages = chat(turns)
    messages[1]["content"][0]["image"] = image
    expected = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    assert tokeniser.ids(turns, add_generation_prompt=True) == expected["input_ids"][0].tolist()
    assert int((expected["token_type_ids"][0] == 1).sum()) == 256


def test_labels_cover_the_answers_and_their_end_of_turn_only(processor):
    tokeniser = ConversationTokeniser(processor)
    answers = ["Yes, a small left pleural effusion blunting the costophrenic angle.", "No pacemaker."]
    encoded = tokeniser.conversation([("Is there a pleural effusion?", answers[0]), ("Any pacemaker?", answers[1])])
    learned = [token for token in encoded.labels if token != IGNORE_INDEX]
    assert processor.tokenizer.decode(learned) == "<end_of_turn>".join(answers) + "<end_of_turn>"
    for token, label in zip(encoded.input_ids, encoded.labels, strict=True):
        assert label in (IGNORE_INDEX, token)


def test_batches_are_a_pure_function_of_seed_and_step(processor):
    data = TeachingData(processor, data_seed=3, films_per_step=2)
    first, again, other = data.batch(5), data.batch(5), data.batch(6)
    assert torch.equal(first.input_ids, again.input_ids) and torch.equal(first.pixel_values, again.pixel_values)
    assert not torch.equal(first.pixel_values, other.pixel_values)
    assert tuple(first.pixel_values.shape) == (2, 3, 896, 896)
    assert first.image_index.tolist() == [0, 0, 1, 1]
    assert (first.token_type_ids.sum(dim=1) == 256).all()
    assert first.answer_tokens > 100
    seeds = [data.film_seed(step, slot) for step in (0, 10**6) for slot in (0, 1)]
    assert min(seeds) >= TRAIN_SEED_BASE  # never a held-out phantom
