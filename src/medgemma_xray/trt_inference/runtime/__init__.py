"""Torch-free pieces of TRTInference: prompt text, image preprocessing, graph executors, CUDA memory."""
