"""Checked CUDA calls and owned buffers, after NVIDIA's samples/python/common_runtime.py (cuda-python bindings).

Written against cuda.bindings.runtime (cuda-python 13). CI runs it against devtools.trt_standins.cuda_host (host
memory standing in for the GPU, every copy bounds-checked); benchmarks/h200_tensorrt_executor.py runs it for real.
"""

from __future__ import annotations

from pathlib import Path

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
        self.array = np.frombuffer(raw, dtype=dtype)  # type: ignore[call-overload]  # a ctypes array is a buffer; numpy's stubs do not list ctypes arrays

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
    if host.nbytes > device.nbytes:
        raise ValueError(f"copy of {host.nbytes} bytes into a device buffer of {device.nbytes}")
    cudart = _cudart()
    kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    cuda_call(cudart.cudaMemcpyAsync(device.pointer, host.ctypes.data, host.nbytes, kind, stream.handle))


def copy_device_to_host(host: np.ndarray, device: DeviceBuffer, stream: CudaStream) -> None:
    if host.nbytes > device.nbytes:
        raise ValueError(f"copy of {host.nbytes} bytes out of a device buffer of {device.nbytes}")
    cudart = _cudart()
    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
    cuda_call(cudart.cudaMemcpyAsync(host.ctypes.data, device.pointer, host.nbytes, kind, stream.handle))


def copy_device_to_device_2d(
    target: DeviceBuffer,
    target_pitch: int,
    source: DeviceBuffer,
    source_pitch: int,
    width: int,
    rows: int,
    stream,
    target_offset: int = 0,
) -> None:
    """rows x width bytes between two pitched layouts, the target's first row target_offset bytes into its buffer
    (re-laying a KV cache at another capacity; writing a step's new rows into every head's rows)."""
    if target_offset + (rows - 1) * target_pitch + width > target.nbytes:
        raise ValueError(f"a {rows} x {width}-byte copy at {target_offset} overruns a buffer of {target.nbytes}")
    cudart = _cudart()
    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    cuda_call(
        cudart.cudaMemcpy2DAsync(
            int(target.pointer) + target_offset,
            target_pitch,
            source.pointer,
            source_pitch,
            width,
            rows,
            kind,
            stream.handle,
        )
    )


def memset_async(buffer: DeviceBuffer, value: int, nbytes: int, stream: CudaStream) -> None:
    if nbytes > buffer.nbytes:
        raise ValueError(f"memset of {nbytes} bytes on a buffer of {buffer.nbytes}")
    cuda_call(_cudart().cudaMemsetAsync(buffer.pointer, value, nbytes, stream.handle))


def device_compute_capability(device: int = 0) -> tuple[str, str]:
    """(GPU name, "major.minor") of a device; raises RuntimeError where there is no CUDA device."""
    cudart = _cudart()
    properties = cuda_call(cudart.cudaGetDeviceProperties(device))
    name = properties.name.decode() if isinstance(properties.name, bytes) else str(properties.name)
    return name.rstrip("\x00"), f"{properties.major}.{properties.minor}"


def nvidia_driver_present() -> bool:
    """Whether an NVIDIA kernel driver is loaded here (what every CUDA call needs, whatever the Python package)."""
    return Path("/proc/driver/nvidia").exists() or Path("/dev/nvidiactl").exists()


def probe_cuda_gpu(device: int = 0) -> tuple[tuple[str, str] | None, str]:
    """((GPU name, "major.minor"), "") where cuda-python sees a GPU, else (None, why not): for logs and errors.
    Installing cuda-python is suggested only where an NVIDIA driver is present: on a host without one it would
    not help."""
    try:
        from cuda.bindings import runtime  # noqa: F401
    except ImportError as exc:
        if not nvidia_driver_present():
            return None, "this host has no NVIDIA GPU driver (no /proc/driver/nvidia, no /dev/nvidiactl)"
        return None, f"cuda-python is not installed ({exc}); pip install cuda-python==13.4.4"
    try:
        return device_compute_capability(device), ""
    except Exception as exc:  # no driver, no device, a driver older than the runtime: say which
        return None, f"cuda-python found no usable CUDA device ({type(exc).__name__}: {exc})"
