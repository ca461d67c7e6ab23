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
    )


def _pytorch_backend(settings: Settings) -> InferenceBackend:
    from pytorch_backend.eager import TorchInference

    return TorchInference(
        settings.resolved_model_path,
        device=settings.device,
        max_resident_conversations=settings.max_resident_conversations,
    )
