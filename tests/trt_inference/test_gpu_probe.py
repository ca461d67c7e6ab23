"""What the GPU probe says where there is no GPU: the reason, and advice only where it would help."""

from __future__ import annotations

import importlib.util

import pytest

from medgemma_xray.trt_inference.runtime.cuda_memory import nvidia_driver_present, probe_cuda_gpu


@pytest.mark.skipif(
    nvidia_driver_present() or importlib.util.find_spec("cuda") is not None,
    reason="for a host without an NVIDIA driver and without cuda-python",
)
def test_a_host_without_a_gpu_driver_is_not_told_to_install_cuda_python():
    gpu, why = probe_cuda_gpu(0)
    assert gpu is None
    assert why == "this host has no NVIDIA GPU driver (no /proc/driver/nvidia, no /dev/nvidiactl)"
    assert "pip install" not in why
