"""Training batches: the processor's own tokenisation, loss on answer tokens only, a pure function of (seed, step)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from medgemma_xray.demo_model.build import build_processor, build_tokenizer
from medgemma_xray.demo_model.dataset import (
    IGNORE_INDEX,
    ConversationTokeniser,
    TeachingData,
    chat,
    tokenizer_corpus,
)
from medgemma_xray.phantoms.evaluation import TRAIN_SEED_BASE


@pytest.fixture(scope="module")
def processor():
    return build_processor(build_tokenizer(tokenizer_corpus(200), vocab_size=1024, split_digits=True))


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
    data = TeachingData(processor, data_seed=3, films_per_step=2, pool_films=6, variants=2)
    first, again, other = data.batch(5), data.batch(5), data.batch(6)
    assert torch.equal(first.input_ids, again.input_ids) and torch.equal(first.pixel_values, again.pixel_values)
    assert not torch.equal(first.pixel_values, other.pixel_values)
    assert tuple(first.pixel_values.shape) == (2, 3, 896, 896)
    assert first.image_index.tolist() == [0, 0, 0, 1, 1, 1]  # three conversations a film
    assert first.tasks == ["findings", "overview", "locate"] * 2
    assert (first.token_type_ids.sum(dim=1) == 256).all()
    assert first.answer_tokens > 100
    assert min(data.film_seed(index) for index in range(6)) >= TRAIN_SEED_BASE  # never a held-out phantom
    # An epoch visits every film once; the next epoch teaches them with their next conversation variant.
    epoch = [index for step in range(3) for index in data.film_indices(step)[0]]
    assert sorted(epoch) == list(range(6)) and data.film_indices(3)[1] == 1


def test_the_pool_holds_exactly_what_the_processor_gives_and_any_worker_count_draws_it(processor):
    """Films are kept as 8 bits after the processor; mapped back they must equal its output exactly, and drawing
    the pool in parallel must not change it (the run is reproducible on any machine)."""
    import numpy as np

    from medgemma_xray.demo_model.dataset import film_image

    alone = TeachingData(processor, data_seed=1, films_per_step=1, pool_films=3, variants=1)
    parallel = TeachingData(processor, data_seed=1, films_per_step=1, pool_films=3, variants=1, workers=2)
    for first, second in zip(alone.films, parallel.films, strict=True):
        assert np.array_equal(first.pixels, second.pixels)
        assert first.variants[0][0].input_ids == second.variants[0][0].input_ids
    seed = alone.film_seed(alone.film_indices(0)[0][0])
    image, _ = film_image(seed, np.random.default_rng([seed, 7]))
    expected = processor.image_processor(images=[image], return_tensors="pt")["pixel_values"][0]
    assert torch.equal(alone.batch(0).pixel_values[0], expected)
    # The pool goes to the device once, also when the name asked for is not the one a tensor reports ("cuda" vs
    # "cuda:0" re-sent 6 GB a step on the H200; "cpu:0" vs "cpu" is the same mismatch on this machine).
    assert alone.pixels_on("cpu:0") is alone.pixels_on("cpu:0")


def test_two_films_tokenise_as_the_processor_does_and_a_pair_batch_places_them_in_order(processor):
    """A pair's conversation holds the prior's image tokens, then the current film's, then the comparison prompt:
    the ids the processor gives for [prior, current, text], as the serving path builds it."""
    from medgemma_xray.grounding.prompts import COMPARISON_PROMPT

    tokeniser = ConversationTokeniser(processor)
    turns = [(COMPARISON_PROMPT, None)]
    messages = chat(turns, images=2)
    messages[1]["content"][0]["image"] = Image.new("RGB", (64, 64))
    messages[1]["content"][1]["image"] = Image.new("RGB", (64, 64), (255, 255, 255))
    assert [item["type"] for item in messages[1]["content"]] == ["image", "image", "text"]
    expected = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    assert tokeniser.ids(turns, add_generation_prompt=True, images=2) == expected["input_ids"][0].tolist()
    assert int((expected["token_type_ids"][0] == 1).sum()) == 512

    data = TeachingData(
        processor, data_seed=2, films_per_step=2, pool_films=2, variants=1, pool_pairs=2, pairs_per_step=1
    )
    batch = data.batch(0)
    (pair_index,) = data.pair_indices(0)
    pair = data.pairs[pair_index]
    assert tuple(batch.pixel_values.shape) == (4, 3, 896, 896)  # two films, then the pair's prior and current
    assert batch.image_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 3] and batch.tasks[-1] == "compare"
    assert batch.token_type_ids.sum(dim=1).tolist() == [256] * 6 + [512]
    prior = torch.from_numpy(pair.prior).float() / 255.0
    assert torch.allclose(batch.pixel_values[2, 0], (prior - 0.5) / 0.5)
    learned = [token for token in batch.labels[-1].tolist() if token != IGNORE_INDEX]
    assert processor.tokenizer.decode(learned).startswith("Compared with the prior: ")
    assert batch.film_labels[2:] == [pair.prior_labels, pair.current_labels]
    assert min(data.pair_seed(index) for index in range(2)) >= TRAIN_SEED_BASE


def test_box_coordinates_are_written_digit_by_digit(processor):
    ids = processor.tokenizer(" [545, 213, 740, 465]")["input_ids"]
    pieces = [processor.tokenizer.decode([token]) for token in ids]
    assert [p for p in pieces if p.strip().isdigit()] == list("545213740465")


def test_extra_films_hold_the_findings_they_were_chosen_for(processor):
    """--extra_films tilts the pool: every extra film holds one of the named findings, its seed lies in the
    training range and outside the plain pool's and the pairs', and the choice is the same on every call."""
    from medgemma_xray.demo_model.dataset import PAIR_SEED_OFFSET, enriched_seeds
    from medgemma_xray.phantoms.findings import sample_labels

    seeds = enriched_seeds(4, 12, ("nodule_or_mass", "pacemaker"))
    assert len(set(seeds)) == 12 and seeds == enriched_seeds(4, 12, ("nodule_or_mass", "pacemaker"))
    base = TRAIN_SEED_BASE + 4 * 100_000_000
    assert all(base + 1_000_000 <= seed < base + PAIR_SEED_OFFSET for seed in seeds)
    assert all(sample_labels(s).present("nodule_or_mass") or sample_labels(s).present("pacemaker") for s in seeds)
    data = TeachingData(
        processor, data_seed=4, films_per_step=2, pool_films=2, variants=1, extra_films=3, extra_with=("pacemaker",)
    )
    assert len(data.films) == 5 and all(film.labels.pacemaker is not None for film in data.films[2:])
    with pytest.raises(ValueError, match="unknown finding"):
        enriched_seeds(4, 1, ("nodules",))
    with pytest.raises(ValueError, match="--extra_with"):
        enriched_seeds(4, 1, ())
