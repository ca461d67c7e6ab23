"""Create a backend by mode; each branch imports only what it needs (vLLM's executor factory shape)."""

from __future__ import annotations

from inference_api.contract import InferenceBackend
from inference_api.types import Mode
from serving.settings import Settings


def create_backend(mode: Mode | str, settings: Settings) -> InferenceBackend:
    mode = Mode.parse(mode)
    if mode is Mode.PYTORCH:
        return _pytorch_backend(settings)
    if settings.engine_path is None:
        raise FileNotFoundError(
            "No engine bundle configured. Build one with optimize_trt_engine.py and set ENGINE_PATH "
            "(or pass --engine_path)."
        )
    from trt_inference.trt_model import TRTInference

    return TRTInference(
        settings.engine_path,
        sequence_slots=settings.kv_slots,
        max_resident_conversations=settings.max_resident_conversations,
        served_model=settings.resolved_model_path,  # the bundle must be built from the model PyTorch serves
        allow_unverified_plans=settings.allow_unverified_plans,
    )


def _pytorch_backend(settings: Settings) -> InferenceBackend:
    """The fast path (static cache, CUDA graphs) on CUDA by default; the eager reference on CPU or when asked."""
    path = settings.torch_path
    if path == "auto":
        path = "fast" if _cuda_wanted(settings.device) else "eager"
    if path == "fast":
        from pytorch_backend.fast import FastTorchInference

        return FastTorchInference(
            settings.resolved_model_path,
            device=settings.device,
            max_resident_conversations=settings.max_resident_conversations,
            slots=settings.kv_slots,
            max_sequence=settings.max_sequence,
        )
    from pytorch_backend.eager import TorchInference

    return TorchInference(
        settings.resolved_model_path,
        device=settings.device,
        max_resident_conversations=settings.max_resident_conversations,
    )


def _cuda_wanted(device: str) -> bool:
    if device == "cpu":
        return False
    import torch

    return torch.cuda.is_available()
