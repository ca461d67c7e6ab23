"""What the PyTorch-backend tests share: three phantom films as the model sees them, three questions, and one
request run to its end with its statistics."""

from __future__ import annotations

import pytest

from medgemma_xray.inference_api.types import GenerationStats
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image

QUESTIONS = ("Findings?", "Is the heart enlarged?", "Any pleural effusion on the left side?")


@pytest.fixture(scope="module")
def films():
    return [model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in range(3)]


def run(backend, request) -> GenerationStats:
    """The request answered alone, start to end: its tokens and log-probabilities."""
    stats = GenerationStats()
    backend.generate(request, stats)
    return stats
