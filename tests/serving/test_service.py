"""The service in process, with real backends: lease semantics across a switch, breaker boundaries."""

from __future__ import annotations

import time

import pytest

from medgemma_xray.inference_api.errors import RequestError
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.serving.service import InferenceService, SwitchError
from medgemma_xray.serving.settings import Settings
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image

pytestmark = pytest.mark.slow


@pytest.fixture()
def image():
    return model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=4), 8))))


def make_service(tmp_path, bundle, **overrides) -> InferenceService:
    settings = Settings(engine_path=bundle, log_dir=tmp_path, device="cpu", **overrides)
    service = InferenceService(settings)
    service.start()
    return service


@pytest.mark.parametrize("torch_path", ["eager", "fast"])
def test_a_running_answer_finishes_on_the_old_backend(tmp_path, int8_bundle, image, torch_path):
    """Both PyTorch paths (the fast one warms up in the switch's load, while requests flow)."""
    service = make_service(tmp_path, int8_bundle, torch_path=torch_path)
    try:
        old = service._current.backend
        request = GenerationRequest(image, (ChatTurn("user", "Findings?"),), max_new_tokens=40)
        stream = service.stream_answer(request)
        first = next(stream)
        record = service.switch_to("trt")
        assert service.mode == "trt" and record.interruption_s < 0.2
        rest = list(stream)  # the leased PyTorch backend keeps serving this answer
        assert rest and rest[-1].startswith(first)
        assert not old.closed and service.info().executor == "onnxruntime-cpu"
        trt_backend = service._current.backend
        service.switch_to("pytorch")
        deadline = time.monotonic() + 10
        while not trt_backend.closed and time.monotonic() < deadline:  # closed once drained (not kept)
            time.sleep(0.05)
        assert trt_backend.closed and service.trt_state == "Not loaded"
    finally:
        service.close()


def test_request_errors_do_not_count_as_tensorrt_failures(tmp_path, int8_bundle, image):
    service = make_service(tmp_path, int8_bundle, inference_mode="trt")
    try:
        too_long = GenerationRequest(image, (ChatTurn("user", "Findings?"),), max_new_tokens=2000)
        with pytest.raises(RequestError, match="exceeds this model's maximum"):
            list(service.stream_answer(too_long))
        assert service.breaker.snapshot().consecutive_failures == 0 and service.mode == "trt"
    finally:
        service.close()


def test_unknown_mode_and_missing_engine_leave_the_mode_alone(tmp_path):
    service = make_service(tmp_path, None)
    try:
        with pytest.raises(RequestError, match="valid modes: pytorch, trt"):
            service.switch_to("onnx")
        with pytest.raises(SwitchError, match="No engine bundle configured"):
            service.switch_to("trt")
        assert service.mode == "pytorch" and service.trt_state.startswith("Failed (No engine bundle configured")
    finally:
        service.close()


def test_a_film_uploaded_to_the_fast_path_is_preprocessed_before_the_question(tmp_path, demo_model_dir, image):
    """The upload handler calls prepare_film: the question's prefill finds the film's pixels already made."""
    from medgemma_xray.inference_api.shared_caches import image_content_hash

    settings = Settings(model_path=demo_model_dir, log_dir=tmp_path, device="cpu", torch_path="fast")
    service = InferenceService(settings)
    service.start()
    try:
        backend = service._current.backend
        service.prepare_film(image)
        assert image_content_hash(image) in backend.pixel_cache
        hits = backend.pixel_cache.hits
        answer = list(service.stream_answer(GenerationRequest(image, (ChatTurn("user", "Findings?"),), 4)))
        assert answer and backend.pixel_cache.hits == hits + 1
    finally:
        service.close()
