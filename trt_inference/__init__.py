"""The inference layer: one contract (base.py), a PyTorch and a TensorRT backend, and the running service.

Nothing heavy is imported here: torch and tensorrt load inside the backend that needs them.
"""
