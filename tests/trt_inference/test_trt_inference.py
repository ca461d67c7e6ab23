"""TRTInference through ONNX Runtime against the PyTorch backend, with no torch in its process."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from medgemma_xray.engine_bundle.integrity import seal
from medgemma_xray.engine_bundle.manifest import ManifestError, check_gpu, read_manifest, write_manifest
from medgemma_xray.inference_api.contract import ChatTurn, GenerationRequest
from medgemma_xray.phantoms.films import png_bytes, quantize
from medgemma_xray.pytorch_backend.hf_reference import hf_generate, hf_inputs
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow
FIRST_N = 16


@pytest.fixture(scope="module")
def torch_backend(demo_model_dir):
    from medgemma_xray.pytorch_backend.eager import TorchInference

    backend = TorchInference(demo_model_dir, device="cpu")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def film():
    """A held-out labelled phantom (seed 42; training uses seeds from 1,000,000): what the demo model reads."""
    from medgemma_xray.phantoms.labelled import labelled_phantom

    return model_input_image(load_radiograph(png_bytes(quantize(labelled_phantom(42).film, 8))))


def torch_tokens(backend, request):
    return hf_generate(backend, request)[0]


def token_ids(backend, request):
    return [step.token_id for step in backend.generate_steps(request)]


def test_two_turn_conversation_matches_pytorch(int8_bundle, torch_backend, film):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    bundle = TRTInference(int8_bundle)
    info = bundle.info()
    assert (info.mode, info.executor, info.precision, info.device) == ("trt", "onnxruntime-cpu", "int8", "cpu")
    first = GenerationRequest(film, (ChatTurn("user", "What are the main findings?"),), max_new_tokens=FIRST_N)
    answer = bundle.generate(first)
    second = GenerationRequest(
        film,
        (*first.turns, ChatTurn("assistant", answer), ChatTurn("user", "Is the heart enlarged?")),
        max_new_tokens=FIRST_N,
    )
    for request in (first, second):
        produced = token_ids(bundle, request)
        expected = torch_tokens(torch_backend, request)
        assert len(produced) >= 3  # an answer, not an immediate stop
        assert produced == expected, f"INT8 greedy tokens differ from PyTorch: {produced} vs {expected}"
    cosine_value = _cosine(torch_backend.image_features([film]), bundle.image_features([film]))
    assert cosine_value > 0.995
    bundle.close()


def test_fp32_bundle_is_exact_past_the_sliding_window(fp32_bundle, torch_backend, film):
    """A conversation longer than the demo's 512-token window: explicit masks must match transformers' own."""
    from medgemma_xray.trt_inference.trt_model import TRTInference

    bundle = TRTInference(fp32_bundle)
    history = (
        ChatTurn("user", "Describe the lungs, pleura, heart, mediastinum, bones and every device you can see. " * 6),
        ChatTurn("assistant", "The lungs are clear. The heart size is normal. No pleural effusion. " * 8),
        ChatTurn("user", "Now compare both costophrenic angles and comment on the hemidiaphragms."),
    )
    request = GenerationRequest(film, history, max_new_tokens=24)
    assert bundle.prompt_ids(request).shape[1] > 512 + 50
    produced = token_ids(bundle, request)
    assert produced == torch_tokens(torch_backend, request)
    bundle.close()


def test_torch_free_preprocessing_matches_the_hf_processor(fp32_bundle, torch_backend, film):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    bundle = TRTInference(fp32_bundle)
    request = GenerationRequest(
        film, (ChatTurn("user", "Any effusion?"), ChatTurn("assistant", "No."), ChatTurn("user", "Sure?"))
    )
    expected = hf_inputs(torch_backend, request)
    assert np.array_equal(bundle.prompt_ids(request), expected["input_ids"].numpy())
    pixels = bundle.preprocess([film])
    assert np.abs(pixels - expected["pixel_values"].numpy()).max() < 1e-6
    bundle.close()


def test_runs_in_a_process_where_torch_cannot_be_imported(int8_bundle, film, tmp_path):
    image_path = tmp_path / "film.png"
    film.save(image_path)
    script = f"""
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not available in this process")
sys.meta_path.insert(0, NoTorch())
try:
    import torch
    sys.exit("torch imported")
except ImportError:
    pass
from PIL import Image
from medgemma_xray.inference_api.contract import ChatTurn, GenerationRequest
from medgemma_xray.trt_inference import TRTInference  # the seeds' own integration: lazy, torch-free
backend = TRTInference(engine_path={str(int8_bundle / "engines" / "decoder.plan")!r}, input_shape=(1, 3, 896, 896))
request = GenerationRequest(Image.open({str(image_path)!r}).convert("RGB"), (ChatTurn("user", "Findings?"),), max_new_tokens=8)
text = "".join(backend.stream_generate(request))
print("EXECUTOR", backend.info().executor)
print("ANSWER", len(text), repr(text))
print("TORCH LOADED", any(m == "torch" or m.startswith("torch.") for m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "EXECUTOR onnxruntime-cpu" in result.stdout
    assert "TORCH LOADED False" in result.stdout
    answer_line = next(line for line in result.stdout.splitlines() if line.startswith("ANSWER"))
    assert int(answer_line.split()[1]) > 0


def test_manifest_from_another_tensorrt_version_is_refused(int8_bundle, tmp_path):
    import tensorrt_rtx

    from medgemma_xray.trt_inference.trt_model import TRTInference

    bundle = tmp_path / "old"
    shutil.copytree(int8_bundle, bundle)
    manifest = read_manifest(bundle)
    manifest["tensorrt"]["version"] = "1.0.0.21"  # as if built, and sealed, by another TensorRT-RTX
    write_manifest(bundle, seal(bundle, manifest))
    with pytest.raises(ManifestError) as error:
        TRTInference(bundle, executor="tensorrt")
    message = str(error.value)
    assert "1.0.0.21" in message and tensorrt_rtx.__version__ in message
    assert "Rebuild it on this host: python optimize_trt_engine.py" in message and "--precision int8" in message


def test_engine_for_another_gpu_is_refused():
    manifest = {
        "tensorrt": {
            "target": "tensorrt",
            "version": "10.13.0",
            "gpu_name": "NVIDIA L40S",
            "compute_capability": "8.9",
            "hardware_compatibility": "NONE",
        },
        "build": {"command": "python optimize_trt_engine.py --model_path m --precision int8 --output_path e"},
    }
    with pytest.raises(
        ManifestError, match=r"built for compute capability 8.9 \(NVIDIA L40S\), this host has 9.0 \(NVIDIA H200\)"
    ):
        check_gpu(manifest, "NVIDIA H200", "9.0")
    check_gpu(manifest, "NVIDIA L40S", "8.9")  # the same GPU generation loads
    manifest["tensorrt"]["hardware_compatibility"] = "AMPERE_PLUS"
    check_gpu(manifest, "NVIDIA H200", "9.0")  # hardware-compatible plans run on any Ampere+ GPU


def test_onnx_only_bundle_refuses_the_tensorrt_executor_with_the_fix(fp32_bundle):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    with pytest.raises(ManifestError, match="--from_onnx"):
        TRTInference(fp32_bundle, executor="tensorrt")


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_follow_up_keeps_the_decoder_slot_and_prefills_only_its_new_tokens(int8_bundle, film):
    """KV reuse across turns on the engine path (ONNX Runtime executor): same tokens, a fraction of the prefill."""
    from medgemma_xray.inference_api.types import GenerationStats
    from medgemma_xray.trt_inference.trt_model import TRTInference

    bundle = TRTInference(int8_bundle)
    try:
        first = GenerationRequest(film, (ChatTurn("user", "Findings?"),), max_new_tokens=8, conversation_id="case")
        answer = bundle.generate(first)
        assert bundle.resident_conversations == ["case"]
        turns = (*first.turns, ChatTurn("assistant", answer), ChatTurn("user", "And the heart?"))
        kept, fresh = GenerationStats(), GenerationStats()
        bundle.generate(GenerationRequest(film, turns, max_new_tokens=8, conversation_id="case"), kept)
        bundle.generate(GenerationRequest(film, turns, max_new_tokens=8), fresh)
        assert kept.reused_tokens > 256 and fresh.reused_tokens == 0
        assert kept.token_ids == fresh.token_ids
    finally:
        bundle.close()


def test_input_shape_other_than_the_bundles_is_refused_naming_its_shape(int8_bundle):
    from medgemma_xray.trt_inference import TRTInference

    with pytest.raises(ManifestError, match=r"takes pixel values of shape \(1\.\.2, 3, 896, 896\)"):
        TRTInference(engine_path=int8_bundle, input_shape=(1, 3, 512, 512))
    with pytest.raises(ManifestError, match="--max_batch"):
        TRTInference(engine_path=int8_bundle, input_shape=(4, 3, 896, 896))  # the bundle's max_batch is 2


def test_a_prior_film_runs_the_vision_graph_per_film_and_matches_pytorch(fp32_bundle, torch_backend, film):
    """Two films in one prompt (the prior first): each film's rows placed by position, as transformers places them.
    The logits tell a misplaced or swapped film from a right one (the demo's words may not change with a prior)."""
    from medgemma_xray.phantoms.labelled import labelled_phantom
    from medgemma_xray.trt_inference.trt_model import TRTInference

    prior = model_input_image(load_radiograph(png_bytes(quantize(labelled_phantom(43).film, 8))))
    bundle = TRTInference(fp32_bundle)
    assert bundle.info().checkpoint_kind == "demo checkpoint"  # the profile the build recorded
    request = GenerationRequest(
        film, (ChatTurn("user", "What changed since the prior film?"),), max_new_tokens=12, prior_image=prior
    )
    assert bundle.prompt_ids(request)[0].tolist().count(bundle.image_token_id) == 512
    assert token_ids(bundle, request) == torch_tokens(torch_backend, request)
    swapped = GenerationRequest(prior, request.turns, max_new_tokens=12, prior_image=film)
    for case in (request, swapped):
        assert np.allclose(bundle.next_token_logits(case), torch_backend.next_token_logits(case), atol=1e-3)
    bundle.close()
