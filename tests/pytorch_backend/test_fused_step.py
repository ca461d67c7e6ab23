"""The fused decode step (KV write inside attention) and the 8-bit weight mode on the demo checkpoint, on CPU: the
fused bf16 step gives the current step's tokens; int8 passes its start gate; a broken scale is refused at start."""

from __future__ import annotations

import pytest

from medgemma_xray.inference_api.types import GenerationStats
from medgemma_xray.pytorch_backend.weight_gate import gate_requests
from medgemma_xray.serving.settings import Settings, SettingsError


@pytest.fixture(scope="module")
def current(demo_model_dir):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    backend = FastTorchInference(demo_model_dir, device="cpu", slots=2, max_sequence=1024, max_resident_conversations=1)
    yield backend
    backend.close()


def make(current, **kwargs):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    return FastTorchInference(
        "demo",
        slots=2,
        max_sequence=1024,
        max_resident_conversations=1,
        preloaded=(current.model, current.processor),
        **kwargs,
    )


def tokens(backend, request) -> list[int]:
    stats = GenerationStats()
    backend.generate(request, stats)
    return stats.token_ids


def test_the_fused_step_and_int8_give_the_current_steps_tokens(current):
    fused = make(current, fused_step=True)
    int8 = make(current, weights="int8")
    int8.warm_up()  # runs the gate: a refusal raises here
    assert int8.startup["weight_gate"]["top1_agreement"] >= 0.98
    assert int8.info().precision == "int8 weights, fp32 activations"
    assert fused.info().details["fused_step"] is True
    for request in gate_requests():
        expected = tokens(current, request)
        assert tokens(fused, request) == expected
        assert tokens(int8, request) == expected


def test_a_broken_scale_is_refused_at_start_with_the_matrix_named(current):
    from medgemma_xray.pytorch_backend.weight_gate import WeightModeRefused

    int8 = make(current, weights="int8")
    int8.fused.matrices[1].down_scale[3] *= 1.5  # one output channel's scale off by half
    with pytest.raises(WeightModeRefused, match=r"layers\.1\.down.*FAST_PATH_WEIGHTS=bf16"):
        int8.warm_up()


def test_the_setting_accepts_the_three_formats_and_names_them_when_wrong():
    assert Settings.from_env({"FAST_PATH_WEIGHTS": "fp8"}).fast_path_weights == "fp8"
    assert Settings.from_env({}).fast_path_weights == "bf16"
    with pytest.raises(SettingsError, match="FAST_PATH_WEIGHTS must be one of bf16, int8, fp8"):
        Settings.from_env({"FAST_PATH_WEIGHTS": "int4"})
