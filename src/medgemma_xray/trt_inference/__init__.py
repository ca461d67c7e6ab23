"""TRTInference and its executors: serves engine bundles without torch (TensorRT on a GPU, ONNX Runtime on CPU).

`from medgemma_xray.trt_inference import TRTInference` works and stays cheap: the class is imported on first use.
"""

from __future__ import annotations

__all__ = ["TRTInference"]


def __getattr__(name: str):
    if name == "TRTInference":
        from medgemma_xray.trt_inference.trt_model import TRTInference

        return TRTInference
    raise AttributeError(f"module 'trt_inference' has no attribute {name!r}")
