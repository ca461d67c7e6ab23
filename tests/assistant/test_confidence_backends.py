"""The same tokens give the same confidence on both backends: PyTorch (fp32, CPU) and the fp32 engine bundle run by
TRTInference through ONNX Runtime, on one film and the report prompt.

Tolerance, stated: the two backends' greedy tokens must be identical, their logprobs within 1e-4 of each other
(export parity is ~1e-6 on the demo model), and then every confidence figure within 1e-4
(tests/assistant/test_confidence.py shows logprobs within 1e-4 give confidences within 1e-4).
"""

from __future__ import annotations

import inspect

import pytest

from medgemma_xray.assistant.confidence import answer_confidence
from medgemma_xray.assistant.report import parse_report, report_request
from medgemma_xray.inference_api.types import GenerationStats
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image

pytestmark = pytest.mark.slow
TOLERANCE = 1e-4


def test_same_tokens_same_confidence_on_pytorch_and_the_engine_bundle(demo_model_dir, request):
    from medgemma_xray.trt_inference.trt_model import TRTInference as trt_class

    assert not inspect.isabstract(trt_class), "TRTInference implements the whole token-level contract"
    bundle = request.getfixturevalue("fp32_bundle")  # built only once the test can run
    from medgemma_xray.pytorch_backend.eager import TorchInference

    image = model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=7), 8))))
    results = []
    for backend in (TorchInference(demo_model_dir, device="cpu"), trt_class(bundle, executor="onnxruntime-cpu")):
        try:
            stats = GenerationStats()
            text = backend.generate(report_request(image, max_new_tokens=24), stats)
            results.append((text, stats))
        finally:
            backend.close()
    (torch_text, torch_stats), (trt_text, trt_stats) = results
    assert trt_stats.token_ids == torch_stats.token_ids and trt_text == torch_text
    assert trt_stats.token_texts == torch_stats.token_texts
    assert (
        max(abs(a - b) for a, b in zip(torch_stats.token_logprobs, trt_stats.token_logprobs, strict=True)) <= TOLERANCE
    )
    torch_confidence = answer_confidence(torch_stats.token_ids, torch_stats.token_logprobs, torch_stats.token_texts)
    trt_confidence = answer_confidence(trt_stats.token_ids, trt_stats.token_logprobs, trt_stats.token_texts)
    for name in ("mean_probability", "min_probability", "lowest_span_probability"):
        assert getattr(trt_confidence, name) == pytest.approx(getattr(torch_confidence, name), abs=TOLERANCE), name
    assert trt_confidence.lowest_span == torch_confidence.lowest_span
    torch_report, trt_report = parse_report(torch_text, torch_stats), parse_report(trt_text, trt_stats)
    assert torch_report.confidence.keys() == trt_report.confidence.keys()
    for key, value in torch_report.confidence.items():
        assert trt_report.confidence[key].mean_probability == pytest.approx(value.mean_probability, abs=TOLERANCE)
