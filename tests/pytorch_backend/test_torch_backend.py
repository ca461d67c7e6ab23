"""The PyTorch backend on the demo checkpoint: streaming, multi-turn prompts, features, lifecycle."""

from __future__ import annotations

import numpy as np
import pytest

from devtools.phantoms import chest_phantom, png_bytes, quantize
from inference_api.contract import BackendClosedError, ChatTurn, GenerationRequest, GenerationStats
from xray_io import load_radiograph
from xray_io.preprocess import model_input_image


@pytest.fixture(scope="module")
def backend(demo_model_dir):
    from pytorch_backend.eager import TorchInference

    model = TorchInference(demo_model_dir, device="cpu")
    yield model
    model.close()


@pytest.fixture(scope="module")
def image():
    return model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=5), 8)), "film.png"))


def test_info_says_demo_fp32_cpu(backend):
    info = backend.info()
    assert (info.mode, info.precision, info.device, info.executor) == ("pytorch", "fp32", "cpu", "transformers")
    assert info.is_demo and "random weights" in info.model_id


def test_stream_is_incremental_and_matches_one_shot(backend, image):
    request = GenerationRequest(image, (ChatTurn("user", "What are the findings?"),), max_new_tokens=24)
    stats = GenerationStats()
    fragments = list(backend.stream_generate(request, stats))
    assert len(fragments) > 1
    assert stats.new_tokens == 24 and stats.prompt_tokens > 256 and stats.first_token_s > 0
    assert "".join(fragments) == backend.generate(request)  # greedy: deterministic


def test_prompt_uses_chat_template_system_prompt_and_history(backend, image):
    request = GenerationRequest(
        image,
        (ChatTurn("user", "First question?"), ChatTurn("assistant", "First answer."), ChatTurn("user", "Follow-up?")),
    )
    inputs = backend.model_inputs(request)
    text = backend.processor.tokenizer.decode(inputs["input_ids"][0])
    assert text.startswith("<bos><start_of_turn>user\nYou are an expert radiologist.\n\n")
    assert "First answer.<end_of_turn>\n<start_of_turn>user\nFollow-up?<end_of_turn>\n<start_of_turn>model\n" in text
    assert int((inputs["input_ids"] == backend.model.config.image_token_id).sum()) == 256
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 896, 896)


def test_next_token_distribution_depends_on_question_and_film(backend, image):
    import torch

    def next_token_logits(question, film):
        inputs = backend.model_inputs(GenerationRequest(film, (ChatTurn("user", question),)))
        with torch.inference_mode():
            return backend.model(**inputs).logits[0, -1].numpy()

    base = next_token_logits("Is there a pneumothorax?", image)
    other_question = next_token_logits("Describe the mediastinum and heart size please.", image)
    other_film = next_token_logits("Is there a pneumothorax?", image.transpose(0))  # mirrored film
    assert np.abs(base - other_question).max() > 1e-3
    assert np.abs(base - other_film).max() > 1e-3  # the demo projector is random, not zero: films matter


def test_image_features_shape(backend, image):
    features = backend.image_features([image, image])
    assert features.shape == (2, 256, backend.model.config.text_config.hidden_size)
    assert features.dtype == np.float32 and np.isfinite(features).all()
    assert np.allclose(features[0], features[1])


def test_bad_requests_are_refused(backend, image):
    with pytest.raises(ValueError, match="alternate"):
        backend.generate(GenerationRequest(image, (ChatTurn("assistant", "hi"),)))
    with pytest.raises(ValueError, match="empty"):
        backend.generate(GenerationRequest(image, (ChatTurn("user", "   "),)))
    with pytest.raises(ValueError, match="max_new_tokens"):
        backend.generate(GenerationRequest(image, (ChatTurn("user", "q"),), max_new_tokens=0))


def test_close_is_idempotent_and_final(demo_model_dir, image):
    from pytorch_backend.eager import TorchInference

    model = TorchInference(demo_model_dir, device="cpu")
    assert model.warm_up() > 0
    model.close()
    model.close()
    with pytest.raises(BackendClosedError):
        model.generate(GenerationRequest(image, (ChatTurn("user", "q"),)))


def test_demo_checkpoint_is_deterministic(tmp_path):
    from devtools.demo_checkpoint.build import write_demo_checkpoint
    from pytorch_backend.checkpoint import weights_sha256

    first, second = write_demo_checkpoint(tmp_path / "a"), write_demo_checkpoint(tmp_path / "b")
    assert weights_sha256(first) == weights_sha256(second)
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()


def test_not_a_model_directory_is_explained(tmp_path):
    from pytorch_backend.checkpoint import CheckpointError, describe_checkpoint

    with pytest.raises(CheckpointError, match="MODEL_PATH"):
        describe_checkpoint(tmp_path)
