"""Real CUDA for the TensorRT stand-in, on a GPU host: the engine stand-in reads and writes real device memory
(bounds-checked with cuMemGetAddressRange), and a counting proxy around cuda.bindings.runtime poisons every new
device allocation with 0xFF (NaN floats) and tracks what is live, so 'every allocation freed' is checked on a GPU.
"""

from __future__ import annotations

import types

import numpy as np


def _address(handle) -> int:
    """cuda-python handles and pointers as integers (int() where supported, else getPtr())."""
    try:
        return int(handle)
    except TypeError:
        return int(handle.getPtr())


class CountingCudaRuntime(types.ModuleType):
    """cuda.bindings.runtime with allocation bookkeeping; every other name passes through untouched."""

    def __init__(self, real) -> None:
        super().__init__("cuda.bindings.runtime", "counting proxy over the real cuda.bindings.runtime")
        self._real = real
        self.device: dict[int, int] = {}
        self.host: set[int] = set()
        self.streams: set[int] = set()
        self.mallocs = self.frees = 0
        self.fail_malloc_after: int | None = None

    def __getattr__(self, name):
        return getattr(self._real, name)

    def cudaMalloc(self, nbytes):  # noqa: N802
        real = self._real
        if self.fail_malloc_after is not None and self.mallocs >= self.fail_malloc_after:
            return (real.cudaError_t.cudaErrorMemoryAllocation,)
        error, pointer = real.cudaMalloc(nbytes)
        if error == real.cudaError_t.cudaSuccess:
            (poison_error,) = real.cudaMemset(pointer, 0xFF, nbytes)
            assert poison_error == real.cudaError_t.cudaSuccess, poison_error
            self.device[_address(pointer)] = int(nbytes)
            self.mallocs += 1
        return error, pointer

    def cudaFree(self, pointer):  # noqa: N802
        result = self._real.cudaFree(pointer)
        if result[0] == self._real.cudaError_t.cudaSuccess:
            self.device.pop(_address(pointer), None)
            self.frees += 1
        return result

    def cudaMallocHost(self, nbytes):  # noqa: N802
        error, pointer = self._real.cudaMallocHost(nbytes)
        if error == self._real.cudaError_t.cudaSuccess:
            self.host.add(_address(pointer))
            self.mallocs += 1
        return error, pointer

    def cudaFreeHost(self, pointer):  # noqa: N802
        result = self._real.cudaFreeHost(pointer)
        if result[0] == self._real.cudaError_t.cudaSuccess:
            self.host.discard(_address(pointer))
            self.frees += 1
        return result

    def cudaStreamCreate(self):  # noqa: N802
        error, stream = self._real.cudaStreamCreate()
        if error == self._real.cudaError_t.cudaSuccess:
            self.streams.add(_address(stream))
        return error, stream

    def cudaStreamDestroy(self, stream):  # noqa: N802
        result = self._real.cudaStreamDestroy(stream)
        if result[0] == self._real.cudaError_t.cudaSuccess:
            self.streams.discard(_address(stream))
        return result

    @property
    def live(self) -> tuple[int, int, int]:
        return len(self.device), len(self.host), len(self.streams)


class CudaMemory:
    """What the TensorRT stand-in reads and writes through on a GPU: synchronous, bounds-checked device copies."""

    def __init__(self, runtime, driver) -> None:
        self.runtime, self.driver = runtime, driver
        self.bytes_read = self.bytes_written = 0

    def _check(self, call, what: str):
        error, *results = call
        if int(error) != 0:
            raise RuntimeError(f"{what}: CUDA error {error}")
        return results

    def _bounds(self, pointer: int, nbytes: int) -> None:
        base, size = self._check(self.driver.cuMemGetAddressRange(pointer), f"cuMemGetAddressRange({pointer:#x})")
        if pointer + nbytes > _address(base) + int(size):
            raise RuntimeError(
                f"{nbytes} bytes at {pointer:#x} overrun the allocation at {_address(base):#x} of {int(size)} bytes"
            )

    def synchronize(self, stream: int) -> None:
        self._check(self.runtime.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def read(self, pointer: int, nbytes: int) -> bytes:
        self._bounds(pointer, nbytes)
        host = np.empty(nbytes, dtype=np.uint8)
        kind = self.runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.runtime.cudaMemcpy(host.ctypes.data, pointer, nbytes, kind), "cudaMemcpy D2H")
        self.bytes_read += nbytes
        return host.tobytes()

    def write(self, pointer: int, data: bytes) -> None:
        self._bounds(pointer, len(data))
        host = np.frombuffer(data, dtype=np.uint8)
        kind = self.runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.runtime.cudaMemcpy(pointer, host.ctypes.data, len(data), kind), "cudaMemcpy H2D")
        self.bytes_written += len(data)
