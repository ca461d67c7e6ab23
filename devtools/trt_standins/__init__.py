"""Honest stand-ins for running the real TensorRTExecutor where TensorRT cannot run (CI, and the H200 where only
TensorRT-RTX installs, which refuses SM90): TensorRT's runtime API over ONNX Runtime, and CUDA's runtime API over
host memory. Never imported by serving."""
