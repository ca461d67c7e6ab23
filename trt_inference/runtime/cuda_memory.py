"""Checked CUDA calls and owned buffers, after NVIDIA's samples/python/common_runtime.py (cuda-python bindings).

Not executable on this project's CI (no GPU); written against cuda.bindings.runtime as of CUDA 13.
"""

from __future__ import annotations

import numpy as np


def _cudart():
    from cuda.bindings import runtime as cudart

    return cudart


def cuda_call(call):
    """Unwrap a cuda-python (error, *results) tuple; raise RuntimeError naming the error."""
    cudart = _cudart()
    error, *results = call
    if error != cudart.cudaError_t.cudaSuccess:
        name = cudart.cudaGetErrorName(error)[1]
        raise RuntimeError(f"CUDA error {error}: {name.decode() if isinstance(name, bytes) else name}")
    if not results:
        return None
    return results[0] if len(results) == 1 else tuple(results)


class DeviceBuffer:
    """Device memory owned by this object; free() is idempotent."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        self.pointer = cuda_call(_cudart().cudaMalloc(max(1, self.nbytes)))

    def free(self) -> None:
        if self.pointer is not None:
            cuda_call(_cudart().cudaFree(self.pointer))
            self.pointer = None


class PinnedBuffer:
    """Page-locked host memory with a numpy view, for fast asynchronous copies."""

    def __init__(self, nbytes: int, dtype) -> None:
        cudart = _cudart()
        self.nbytes = int(nbytes)
        self.pointer = cuda_call(cudart.cudaMallocHost(max(1, self.nbytes)))
        import ctypes

        raw = (ctypes.c_byte * max(1, self.nbytes)).from_address(int(self.pointer))
        self.array = np.frombuffer(raw, dtype=dtype)

    def view(self, shape) -> np.ndarray:
        count = int(np.prod(shape))
        return self.array[:count].reshape(shape)

    def free(self) -> None:
        if self.pointer is not None:
            cuda_call(_cudart().cudaFreeHost(self.pointer))
            self.pointer = None


class CudaStream:
    """One stream; use as a context manager so it is always destroyed."""

    def __init__(self) -> None:
        self.handle = cuda_call(_cudart().cudaStreamCreate())

    def synchronize(self) -> None:
        cuda_call(_cudart().cudaStreamSynchronize(self.handle))

    def close(self) -> None:
        if self.handle is not None:
            cuda_call(_cudart().cudaStreamDestroy(self.handle))
            self.handle = None

    def __enter__(self) -> CudaStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def copy_host_to_device(device: DeviceBuffer, host: np.ndarray, stream: CudaStream) -> None:
    cudart = _cudart()
    kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    cuda_call(cudart.cudaMemcpyAsync(device.pointer, host.ctypes.data, host.nbytes, kind, stream.handle))


def copy_device_to_host(host: np.ndarray, device: DeviceBuffer, stream: CudaStream) -> None:
    cudart = _cudart()
    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
    cuda_call(cudart.cudaMemcpyAsync(host.ctypes.data, device.pointer, host.nbytes, kind, stream.handle))


def copy_device_to_device(target: int, source: int, nbytes: int, stream: CudaStream) -> None:
    cudart = _cudart()
    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    cuda_call(cudart.cudaMemcpyAsync(target, source, nbytes, kind, stream.handle))


def device_compute_capability(device: int = 0) -> tuple[str, str]:
    """(GPU name, "major.minor") of a device; raises RuntimeError where there is no CUDA device."""
    cudart = _cudart()
    properties = cuda_call(cudart.cudaGetDeviceProperties(device))
    name = properties.name.decode() if isinstance(properties.name, bytes) else str(properties.name)
    return name.rstrip("\x00"), f"{properties.major}.{properties.minor}"
