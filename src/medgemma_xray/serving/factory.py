"""Create a backend by mode; each branch imports only what it needs (vLLM's executor factory shape).

The one factory of the project: the service, the benchmark and the tests build backends here. A *configuration*
names a backend as an operator or a benchmark table does ("pytorch-fast", "trt"): a serving mode plus the settings
that select its path, so the benchmark's modes and the service's settings cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from medgemma_xray.inference_api.contract import InferenceBackend
from medgemma_xray.inference_api.types import Mode
from medgemma_xray.serving.settings import Settings

# name -> (serving mode, settings that select the path)
CONFIGURATIONS: dict[str, tuple[Mode, dict[str, Any]]] = {
    "pytorch-eager": (Mode.PYTORCH, {"torch_path": "eager"}),
    "pytorch-fast": (Mode.PYTORCH, {"torch_path": "fast"}),
    "pytorch-fast-int8": (Mode.PYTORCH, {"torch_path": "fast", "fast_path_weights": "int8"}),
    "pytorch-fast-fp8": (Mode.PYTORCH, {"torch_path": "fast", "fast_path_weights": "fp8"}),
    "trt": (Mode.TRT, {}),
}


def configure(name: str, settings: Settings) -> tuple[Mode, Settings]:
    """The serving mode and settings of a named configuration. Unknown names raise ValueError listing the valid."""
    if name not in CONFIGURATIONS:
        raise ValueError(f"unknown backend configuration {name!r}; valid: {', '.join(CONFIGURATIONS)}")
    mode, overrides = CONFIGURATIONS[name]
    return mode, dataclasses.replace(settings, inference_mode=mode, **overrides)


def create_backend(mode: Mode | str, settings: Settings, preloaded: Any = None) -> InferenceBackend:
    """A new backend for `mode`. preloaded: (model, processor) already in memory, shared by PyTorch backends so a
    benchmark loads the weights once (ignored by TensorRT)."""
    mode = Mode.parse(mode)
    if mode is Mode.PYTORCH:
        return _pytorch_backend(settings, preloaded)
    if settings.engine_path is None:
        raise FileNotFoundError(
            "No engine bundle configured. Build one with optimize_trt_engine.py and set ENGINE_PATH "
            "(or pass --engine_path)."
        )
    from medgemma_xray.trt_inference.trt_model import TRTInference

    return TRTInference(
        settings.engine_path,
        sequence_slots=settings.kv_slots,
        max_resident_conversations=settings.max_resident_conversations,
        served_model=settings.resolved_model_path,  # the bundle must be built from the model PyTorch serves
        allow_unverified_plans=settings.allow_unverified_plans,
        checkpoint=settings.model_checkpoint,
    )


def _pytorch_backend(settings: Settings, preloaded: Any) -> InferenceBackend:
    """The fast path (static cache, CUDA graphs) on CUDA by default; the eager reference on CPU or when asked."""
    path = settings.torch_path
    if path == "auto":
        path = "fast" if _cuda_wanted(settings.device) else "eager"
    if path == "fast":
        from medgemma_xray.pytorch_backend.fast import FastTorchInference

        return FastTorchInference(
            settings.resolved_model_path,
            device=settings.device,
            max_resident_conversations=settings.max_resident_conversations,
            slots=settings.kv_slots,
            max_sequence=settings.max_sequence,
            prefix_cache_gib=settings.prefix_cache_gib,
            image_cache_gib=settings.image_cache_gib,
            weights=settings.fast_path_weights,
            fused_step=settings.fast_path_fused_step,
            preloaded=preloaded,
            checkpoint=settings.model_checkpoint,
        )
    from medgemma_xray.pytorch_backend.eager import TorchInference

    return TorchInference(
        settings.resolved_model_path,
        device=settings.device,
        max_resident_conversations=settings.max_resident_conversations,
        preloaded=preloaded,
        checkpoint=settings.model_checkpoint,
    )


def _cuda_wanted(device: str) -> bool:
    if device == "cpu":
        return False
    import torch

    return torch.cuda.is_available()
