"""The PyTorch reference backend on the demo checkpoint: the contract's loop against transformers' own generate(),
multi-turn prompts, KV reuse across turns, features, lifecycle."""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.inference_api.contract import BackendClosedError, ChatTurn, GenerationRequest, GenerationStats
from medgemma_xray.inference_api.errors import RequestError
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.pytorch_backend.hf_reference import hf_generate, hf_inputs
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image


@pytest.fixture(scope="module")
def backend(demo_model_dir):
    from medgemma_xray.pytorch_backend.eager import TorchInference

    model = TorchInference(demo_model_dir, device="cpu")
    yield model
    model.close()


@pytest.fixture(scope="module")
def image():
    return model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=5), 8))))


def test_info_says_demo_fp32_cpu(backend):
    info = backend.info()
    assert (info.mode, info.precision, info.device, info.executor) == ("pytorch", "fp32", "cpu", "transformers")
    assert info.is_demo and "not a medical model" in info.model_id
    assert info.demo_notice.startswith("Trained on synthetic phantoms only; not a medical model")


def test_stream_is_incremental_and_matches_one_shot(backend, image):
    request = GenerationRequest(image, (ChatTurn("user", "What are the findings?"),), max_new_tokens=24)
    stats = GenerationStats()
    fragments = list(backend.stream_generate(request, stats))
    assert len(fragments) > 1
    assert 1 < stats.new_tokens <= 24 and stats.prompt_tokens > 256 and stats.first_token_s > 0
    assert "".join(fragments) == backend.generate(request)  # greedy: deterministic


def test_prompt_uses_chat_template_system_prompt_and_history(backend, image):
    request = GenerationRequest(
        image,
        (ChatTurn("user", "First question?"), ChatTurn("assistant", "First answer."), ChatTurn("user", "Follow-up?")),
    )
    inputs = hf_inputs(backend, request)
    assert backend._encode_impl(request).ids == inputs["input_ids"][0].tolist()  # same ids as the processor
    text = backend.processor.tokenizer.decode(inputs["input_ids"][0])
    assert text.startswith("<bos><start_of_turn>user\nYou are an expert radiologist.\n\n")
    assert "First answer.<end_of_turn>\n<start_of_turn>user\nFollow-up?<end_of_turn>\n<start_of_turn>model\n" in text
    assert int((inputs["input_ids"] == backend.model.config.image_token_id).sum()) == 256
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 896, 896)


def test_next_token_distribution_depends_on_question_and_film(backend, image):
    import torch

    def next_token_logits(question, film):
        inputs = hf_inputs(backend, GenerationRequest(film, (ChatTurn("user", question),)))
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


def test_contract_loop_gives_generates_tokens_and_logprobs(backend, image):
    for question in ("What are the findings?", "Is the heart enlarged? Answer briefly."):
        request = GenerationRequest(image, (ChatTurn("user", question),), max_new_tokens=20)
        stats = GenerationStats()
        backend.generate(request, stats)
        tokens, logprobs = hf_generate(backend, request)
        assert stats.token_ids == tokens
        assert np.allclose(stats.token_logprobs, logprobs, atol=1e-4)
        assert all(p <= 0 for p in stats.token_logprobs)


def test_follow_up_reuses_the_kv_cache_and_answers_the_same(backend, image):
    first = GenerationRequest(image, (ChatTurn("user", "Findings?"),), max_new_tokens=12, conversation_id="case-1")
    answer = backend.generate(first)
    turns = (*first.turns, ChatTurn("assistant", answer), ChatTurn("user", "And the heart?"))
    cached, fresh = GenerationStats(), GenerationStats()
    with_cache = backend.generate(GenerationRequest(image, turns, max_new_tokens=12, conversation_id="case-1"), cached)
    backend.forget("case-1")
    without = backend.generate(GenerationRequest(image, turns, max_new_tokens=12), fresh)
    assert cached.reused_tokens > 256 and fresh.reused_tokens == 0  # the film and the first turn were not re-run
    assert cached.token_ids == fresh.token_ids and with_cache == without
    assert "case-1" not in backend.resident_conversations


def test_another_film_under_the_same_conversation_is_not_reused(backend, image):
    request = GenerationRequest(image, (ChatTurn("user", "Findings?"),), max_new_tokens=4, conversation_id="case-2")
    backend.generate(request)
    other, stats = image.transpose(0), GenerationStats()
    backend.generate(GenerationRequest(other, request.turns, max_new_tokens=4, conversation_id="case-2"), stats)
    assert stats.reused_tokens == 0
    backend.forget("case-2")


def test_least_recently_used_conversation_is_evicted(demo_model_dir, image):
    from medgemma_xray.pytorch_backend.eager import TorchInference

    model = TorchInference(demo_model_dir, device="cpu", max_resident_conversations=1)
    try:
        ask = lambda cid: GenerationRequest(image, (ChatTurn("user", "Findings?"),), 4, conversation_id=cid)  # noqa: E731
        first = GenerationStats()
        model.generate(ask("a"), first)
        model.generate(ask("b"))
        assert model.resident_conversations == ["b"]
        again = GenerationStats()
        model.generate(ask("a"), again)  # evicted: re-prefilled transparently
        assert again.reused_tokens == 0 and again.prompt_tokens == first.prompt_tokens
        assert again.token_ids == first.token_ids and again.new_tokens >= 1
    finally:
        model.close()


def test_bad_requests_are_refused(backend, image):
    with pytest.raises(RequestError, match="alternate"):
        backend.generate(GenerationRequest(image, (ChatTurn("assistant", "hi"),)))
    with pytest.raises(RequestError, match="empty"):
        backend.generate(GenerationRequest(image, (ChatTurn("user", "   "),)))
    with pytest.raises(RequestError, match="max_new_tokens"):
        backend.generate(GenerationRequest(image, (ChatTurn("user", "q"),), max_new_tokens=0))


def test_close_is_idempotent_and_final(demo_model_dir, image):
    from medgemma_xray.pytorch_backend.eager import TorchInference

    model = TorchInference(demo_model_dir, device="cpu")
    assert model.warm_up() > 0
    model.close()
    model.close()
    with pytest.raises(BackendClosedError):
        model.generate(GenerationRequest(image, (ChatTurn("user", "q"),)))


def test_demo_checkpoint_is_deterministic(tmp_path):
    from medgemma_xray.demo_model.build import write_demo_checkpoint
    from medgemma_xray.pytorch_backend.checkpoint import weights_sha256

    first, second = write_demo_checkpoint(tmp_path / "a"), write_demo_checkpoint(tmp_path / "b")
    assert weights_sha256(first) == weights_sha256(second)
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()


def test_not_a_model_directory_is_explained(tmp_path):
    from medgemma_xray.pytorch_backend.checkpoint import CheckpointError, describe_checkpoint

    with pytest.raises(CheckpointError, match="MODEL_PATH"):
        describe_checkpoint(tmp_path)
