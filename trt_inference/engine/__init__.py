"""Engine building: ONNX export, quantization, TensorRT builds, verification, manifest.

Only export, verification against PyTorch and calibration import torch; the manifest and masks do not,
because the torch-free runtime (trt_model.py) reads them too.
"""
