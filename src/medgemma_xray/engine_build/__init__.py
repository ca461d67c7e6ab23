"""Engine building: ONNX export, quantization, TensorRT builds, verification. Driven by optimize_trt_engine.py.

Imports torch (export, the PyTorch reference); never imported by serving.
"""
