"""Create a backend by name; each branch imports only what it needs (vLLM's executor factory shape)."""

from __future__ import annotations

from inference_api.contract import InferenceBackend
from serving.settings import VALID_MODES, Settings


def create_backend(mode: str, settings: Settings) -> InferenceBackend:
    if mode == "pytorch":
        from pytorch_backend.eager import TorchInference

        return TorchInference(settings.resolved_model_path, device=settings.device)
    if mode == "trt":
        from trt_inference.trt_model import TRTInference

        if settings.engine_path is None:
            raise FileNotFoundError(
                "No engine bundle configured. Build one with optimize_trt_engine.py and set ENGINE_PATH "
                "(or pass --engine_path)."
            )
        return TRTInference(settings.engine_path)
    raise ValueError(f"unknown inference mode {mode!r}; valid modes: {', '.join(VALID_MODES)}")
