"""The training script: its loss is the model's own, and a run is reproducible and leaves a complete record."""

from __future__ import annotations

import json

import pytest
import torch

from medgemma_xray.demo_model import train
from medgemma_xray.demo_model.build import build_config, build_model, build_processor, build_tokenizer
from medgemma_xray.demo_model.dataset import ConversationTokeniser, TeachingData, tokenizer_corpus
from medgemma_xray.pytorch_backend.checkpoint import describe_checkpoint, weights_sha256


def test_shared_image_loss_equals_the_models_own_forward_loss():
    """One vision pass shared by several conversations, and a pair's two films placed in order, must give the loss
    the model computes per sequence from that sequence's own films."""
    torch.manual_seed(0)
    processor = build_processor(build_tokenizer(tokenizer_corpus(50), vocab_size=512, split_digits=True))
    model = build_model(build_config(len(processor.tokenizer), train.TEXT_CONFIG, train.VISION_CONFIG))
    train.prepare_for_training(model, 0)
    data = TeachingData(
        processor, data_seed=0, films_per_step=1, pool_films=1, variants=1, pool_pairs=1, pairs_per_step=1
    )
    batch = data.batch(0)
    assert batch.tasks == ["findings", "overview", "locate", "compare"]
    per_task: dict = {}
    loss, _ = train.answer_loss(model, batch, "cpu", per_task)
    assert set(per_task) == set(batch.tasks)
    own = []
    runs = iter(batch.image_index.tolist())
    for row in range(batch.input_ids.shape[0]):
        length = int(batch.attention_mask[row].sum())
        films = [next(runs) for _ in range(int(batch.token_type_ids[row].sum()) // 256)]
        output = model(
            input_ids=batch.input_ids[row : row + 1, :length],
            pixel_values=batch.pixel_values[films],
            attention_mask=batch.attention_mask[row : row + 1, :length],
            token_type_ids=batch.token_type_ids[row : row + 1, :length],
            labels=batch.labels[row : row + 1, :length],
        )
        count = (batch.labels[row, 1:length] != -100).sum()
        own.append((output.loss * count, count))
    expected = sum(total for total, _ in own) / sum(count for _, count in own)  # the mean over all answer tokens
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-4)

    tokeniser = ConversationTokeniser(processor)
    prompt = tokeniser.ids([("Is there a pleural effusion?", None)], add_generation_prompt=True)
    header = processor.tokenizer("<start_of_turn>model\n", add_special_tokens=False)["input_ids"]
    assert prompt[-len(header) :] == header


TINY = [
    "--steps",
    "2",
    "--films_per_step",
    "1",
    "--pool_films",
    "2",
    "--variants",
    "1",
    "--vocab_size",
    "1024",  # the pointing prompts take merges: at 512 "Yes" is no longer one token
    "--warmup",
    "1",
    "--log_every",
    "1",
    "--pool_pairs",
    "1",
    "--pairs_per_step",
    "1",
]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    first = [
        "--output",
        str(root / "a"),
        "--seed",
        "4",
        *TINY,
        "--probe_every",
        "1",
        "--probe_phantoms",
        "1",
        "--eval_phantoms",
        "1",
    ]
    second = ["--output", str(root / "b"), "--seed", "4", *TINY, "--probe_every", "0", "--eval_phantoms", "0"]
    assert train.main(first) == 0 and train.main(second) == 0
    return root / "a", root / "b"


@pytest.mark.slow  # two training runs: 15-27 s
def test_training_is_deterministic_for_a_seed(two_runs):
    first, second = two_runs
    assert weights_sha256(first) == weights_sha256(second)  # probing and evaluating never touch the weights
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()


@pytest.mark.slow  # the same two training runs
def test_run_record_and_marker_say_what_the_model_is_and_how_to_remake_it(two_runs):
    first, _ = two_runs
    record = json.loads((first / train.RECORD_FILE).read_text())
    assert record["command"].startswith("python -m medgemma_xray.demo_model.train --output ")
    assert "--seed 4" in record["command"] and record["data"]["data_seed"] == 4
    assert [point["step"] for point in record["loss_curve"]] == [1, 2]
    assert record["held_out_first_token_accuracy"][-1]["step"] == 2
    assert set(record["held_out_eval"]["per_finding"]) >= {"pleural_effusion", "pacemaker"}
    assert record["hardware"]["device"] == "cpu" and record["hardware"]["threads"] == 2
    assert record["train_wall_s"] > 0 and record["model_config"]["parameters"] > 0
    assert "not a medical model" in record["notice"]
    description = describe_checkpoint(first)
    assert description.is_demo and description.model_id == train.TRAINED_MODEL_ID
    # Taught to point and to compare: the marker declares both, and the checkpoint profile reads them.
    marker = json.loads((first / "demo_checkpoint.json").read_text())
    assert marker["capabilities"] == ["localisation", "longitudinal"]
    assert set(record["loss_curve"][-1]["task_loss"]) == {"findings", "overview", "locate", "compare"}
    from medgemma_xray.engine_bundle.checkpoint_profile import checkpoint_profile

    assert checkpoint_profile(first).capabilities == {"localisation", "longitudinal"}


@pytest.mark.slow  # a third tiny run, continued from the first
def test_a_continued_run_starts_from_its_parent_and_records_the_lineage(two_runs, tmp_path):
    first, _ = two_runs
    continued = tmp_path / "continued"
    argv = ["--output", str(continued), "--init_from", str(first), "--seed", "5", *TINY]
    # A tiny learning rate: two steps move each weight by about 2e-4, so the result stays next to its parent.
    small = [
        "--lr",
        "1e-4",
        "--vision_lr",
        "1e-4",
        "--readout_lr",
        "1e-4",
        "--probe_every",
        "0",
        "--eval_phantoms",
        "0",
    ]
    assert train.main([*argv, *small]) == 0
    record = json.loads((continued / train.RECORD_FILE).read_text())
    parent = json.loads((first / train.RECORD_FILE).read_text())
    assert [run["command"] for run in record["continued_from"]] == [parent["command"]]
    assert record["continued_from"][0]["held_out_macro_f1"] == parent["held_out_eval"]["macro_f1"]
    assert f"--init_from {first}" in record["command"]
    assert weights_sha256(continued) != weights_sha256(first)
    assert (continued / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()
    from safetensors.torch import load_file

    theirs, ours = load_file(first / "model.safetensors"), load_file(continued / "model.safetensors")
    for name in ("embed_tokens", "patch_embedding.weight", "layers.0.mlp.down_proj"):
        key = next(key for key in ours if name in key)
        # A fresh model differs from the parent by about the weights' own size; the continued one by far less.
        assert float((ours[key] - theirs[key]).abs().mean()) < float(theirs[key].abs().mean()) / 10, key


def test_a_continued_run_refuses_a_parent_it_cannot_continue(two_runs, tmp_path):
    first, _ = two_runs
    with pytest.raises(SystemExit, match="not a trained demo checkpoint"):
        train.main(["--output", str(tmp_path / "x"), "--init_from", str(tmp_path), *TINY])
    with pytest.raises(SystemExit, match="tokenizer differs"):
        train.main(["--output", str(tmp_path / "y"), "--init_from", str(first), *TINY, "--vocab_size", "900"])
    with pytest.raises(SystemExit, match="same folder"):
        train.main(["--output", str(first), "--init_from", str(first), *TINY])
