"""A host-memory stand-in for the part of cuda.bindings.runtime the TensorRT executor uses.

"Device" memory lives at addresses no host code can dereference, is filled with 0xFF bytes (every float32 a NaN,
every int64 -1) so reading what was never written shows up, and sits between guard gaps so an off-by-one lands
outside any allocation. Every copy and memset is bounds-checked against the allocation it touches; async work is
queued on its stream and runs at cudaStreamSynchronize (or at a free, which synchronizes as CUDA's does), so a
missing synchronize or a staging buffer overwritten too early changes the result. Pinned host memory is real host
memory (the executor builds numpy views on it), 0xFF-filled too. Live allocations and streams are counted.
"""

from __future__ import annotations

import bisect
import enum
import types
from dataclasses import dataclass, field

import numpy as np

DEVICE_BASE = 0x7F00_0000_0000
ALIGNMENT = 256
GUARD = 4096
POISON = 0xFF


class cudaError_t(enum.IntEnum):  # noqa: N801 (CUDA's own names)
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInvalidDevicePointer = 17
    cudaErrorInvalidResourceHandle = 400


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class StandinMemoryError(RuntimeError):
    """An access outside every allocation, or of the wrong kind of memory."""


@dataclass(frozen=True)
class _Stream:
    number: int

    def __int__(self) -> int:
        return self.number


@dataclass
class _Allocation:
    base: int
    data: np.ndarray  # uint8


@dataclass
class HostCudaRuntime:
    """Module-shaped: install with as_module(); inspect live_* and the counters in tests."""

    device_name: str = "Host stand-in for an NVIDIA GPU"
    capability: tuple[int, int] = (9, 0)
    fail_malloc_after: int | None = None  # the next cudaMalloc past this many fails (partial construction tests)
    device: dict[int, _Allocation] = field(default_factory=dict)
    host: dict[int, _Allocation] = field(default_factory=dict)
    streams: dict[int, list] = field(default_factory=dict)
    mallocs: int = 0
    frees: int = 0
    bytes_copied: int = 0
    last_error: str = ""

    def __post_init__(self) -> None:
        self._next_address = DEVICE_BASE
        self._next_stream = 1

    # --- bookkeeping ---------------------------------------------------------------------------------------------
    def _fail(self, error: cudaError_t, detail: str):
        self.last_error = detail
        return (error,)

    def find(self, pointer: int, nbytes: int, where: dict[int, _Allocation]) -> tuple[_Allocation, int]:
        """The allocation holding [pointer, pointer + nbytes) and the offset into it; StandinMemoryError if none."""
        bases = sorted(where)
        index = bisect.bisect_right(bases, pointer) - 1
        if index >= 0:
            allocation = where[bases[index]]
            offset = pointer - allocation.base
            if offset + nbytes <= allocation.data.size:
                return allocation, offset
            raise StandinMemoryError(
                f"{nbytes} bytes at offset {offset} overrun an allocation of {allocation.data.size} bytes"
            )
        raise StandinMemoryError(f"address {pointer:#x} is in no allocation")

    def _resolve(self, pointer: int, nbytes: int, device_side: bool) -> np.ndarray:
        allocation, offset = self.find(pointer, nbytes, self.device if device_side else self.host)
        return allocation.data[offset : offset + nbytes]

    def read_device(self, pointer: int, nbytes: int) -> bytes:
        return self._resolve(pointer, nbytes, True).tobytes()

    def write_device(self, pointer: int, data: bytes) -> None:
        self._resolve(pointer, len(data), True)[...] = np.frombuffer(data, dtype=np.uint8)

    def synchronize_all(self) -> None:
        for number in list(self.streams):
            self._run_pending(number)

    def _run_pending(self, number: int) -> None:
        pending, self.streams[number] = self.streams[number], []
        for operation in pending:
            operation()

    @property
    def live_device(self) -> int:
        return len(self.device)

    @property
    def live_host(self) -> int:
        return len(self.host)

    @property
    def live_streams(self) -> int:
        return len(self.streams)

    # --- the API ---------------------------------------------------------------------------------------------------
    def cudaGetErrorName(self, error):  # noqa: N802
        return cudaError_t.cudaSuccess, cudaError_t(error).name.encode()

    def cudaGetDeviceProperties(self, device: int):  # noqa: N802
        if device != 0:
            return self._fail(cudaError_t.cudaErrorInvalidValue, f"no device {device}")
        properties = types.SimpleNamespace(
            name=self.device_name.encode(), major=self.capability[0], minor=self.capability[1]
        )
        return cudaError_t.cudaSuccess, properties

    def cudaMalloc(self, nbytes: int):  # noqa: N802
        if self.fail_malloc_after is not None and self.mallocs >= self.fail_malloc_after:
            return self._fail(cudaError_t.cudaErrorMemoryAllocation, "injected allocation failure")
        base = self._next_address
        self._next_address += (int(nbytes) + GUARD + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        self.device[base] = _Allocation(base, np.full(int(nbytes), POISON, dtype=np.uint8))
        self.mallocs += 1
        return cudaError_t.cudaSuccess, base

    def cudaFree(self, pointer: int):  # noqa: N802
        self.synchronize_all()  # cudaFree synchronizes the device
        if pointer not in self.device:
            return self._fail(cudaError_t.cudaErrorInvalidDevicePointer, f"cudaFree of {pointer:#x}: not allocated")
        del self.device[pointer]
        self.frees += 1
        return (cudaError_t.cudaSuccess,)

    def cudaMallocHost(self, nbytes: int):  # noqa: N802
        data = np.full(int(nbytes), POISON, dtype=np.uint8)
        base = int(data.ctypes.data)
        self.host[base] = _Allocation(base, data)
        self.mallocs += 1
        return cudaError_t.cudaSuccess, base

    def cudaFreeHost(self, pointer: int):  # noqa: N802
        self.synchronize_all()
        if pointer not in self.host:
            return self._fail(cudaError_t.cudaErrorInvalidValue, f"cudaFreeHost of {pointer:#x}: not allocated")
        del self.host[pointer]
        self.frees += 1
        return (cudaError_t.cudaSuccess,)

    def cudaStreamCreate(self):  # noqa: N802
        stream = _Stream(self._next_stream)
        self._next_stream += 1
        self.streams[stream.number] = []
        return cudaError_t.cudaSuccess, stream

    def _stream(self, stream) -> int | None:
        number = int(stream)
        return number if number in self.streams else None

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        number = self._stream(stream)
        if number is None:
            return self._fail(cudaError_t.cudaErrorInvalidResourceHandle, f"unknown stream {stream}")
        self._run_pending(number)
        return (cudaError_t.cudaSuccess,)

    def cudaStreamDestroy(self, stream):  # noqa: N802
        number = self._stream(stream)
        if number is None:
            return self._fail(cudaError_t.cudaErrorInvalidResourceHandle, f"unknown stream {stream}")
        self._run_pending(number)
        del self.streams[number]
        return (cudaError_t.cudaSuccess,)

    def _sides(self, kind) -> tuple[bool, bool]:
        kind = cudaMemcpyKind(kind)
        if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
            return True, False
        if kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
            return False, True
        if kind == cudaMemcpyKind.cudaMemcpyDeviceToDevice:
            return True, True
        raise StandinMemoryError(f"{kind.name}: the executor names the direction of every copy")

    def _enqueue(self, stream, operation, detail: str):
        number = self._stream(stream)
        if number is None:
            return self._fail(cudaError_t.cudaErrorInvalidResourceHandle, f"{detail}: unknown stream {stream}")
        self.streams[number].append(operation)
        return (cudaError_t.cudaSuccess,)

    def cudaMemcpyAsync(self, dst: int, src: int, nbytes: int, kind, stream):  # noqa: N802
        try:
            dst_device, src_device = self._sides(kind)
            target = self._resolve(int(dst), int(nbytes), dst_device)  # pinned host memory only on the host side
            source = self._resolve(int(src), int(nbytes), src_device)
        except StandinMemoryError as exc:
            return self._fail(cudaError_t.cudaErrorInvalidValue, f"cudaMemcpyAsync: {exc}")

        def copy() -> None:
            target[...] = source
            self.bytes_copied += int(nbytes)

        return self._enqueue(stream, copy, "cudaMemcpyAsync")

    def cudaMemcpy2DAsync(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind, stream):  # noqa: N802
        try:
            dst_device, src_device = self._sides(kind)
            if width > dpitch or width > spitch:
                raise StandinMemoryError(f"width {width} exceeds a pitch ({dpitch}, {spitch})")
            rows = [
                (
                    self._resolve(int(dst) + row * dpitch, width, dst_device),
                    self._resolve(int(src) + row * spitch, width, src_device),
                )
                for row in range(int(height))
            ]
            if dst_device and src_device:
                self._refuse_overlap(int(dst), dpitch, int(src), spitch, width, int(height))
        except StandinMemoryError as exc:
            return self._fail(cudaError_t.cudaErrorInvalidValue, f"cudaMemcpy2DAsync: {exc}")

        def copy() -> None:
            for target, source in rows:
                target[...] = source.copy()
            self.bytes_copied += int(width) * int(height)

        return self._enqueue(stream, copy, "cudaMemcpy2DAsync")

    def _refuse_overlap(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int) -> None:
        dst_end, src_end = dst + (height - 1) * dpitch + width, src + (height - 1) * spitch + width
        if dst < src_end and src < dst_end:
            raise StandinMemoryError("source and destination overlap (undefined for cudaMemcpy2D)")

    def cudaMemset(self, pointer: int, value: int, nbytes: int):  # noqa: N802
        self.synchronize_all()
        try:
            self._resolve(int(pointer), int(nbytes), True)[...] = value
        except StandinMemoryError as exc:
            return self._fail(cudaError_t.cudaErrorInvalidValue, f"cudaMemset: {exc}")
        return (cudaError_t.cudaSuccess,)

    def cudaMemcpy(self, dst: int, src: int, nbytes: int, kind):  # noqa: N802
        self.synchronize_all()
        try:
            dst_device, src_device = self._sides(kind)
            self._resolve(int(dst), int(nbytes), dst_device)[...] = self._resolve(int(src), int(nbytes), src_device)
        except StandinMemoryError as exc:
            return self._fail(cudaError_t.cudaErrorInvalidValue, f"cudaMemcpy: {exc}")
        return (cudaError_t.cudaSuccess,)

    def cudaMemGetInfo(self):  # noqa: N802
        used = sum(allocation.data.size for allocation in self.device.values())
        return cudaError_t.cudaSuccess, (1 << 34) - used, 1 << 34

    def cudaMemsetAsync(self, pointer: int, value: int, nbytes: int, stream):  # noqa: N802
        try:
            target = self._resolve(int(pointer), int(nbytes), True)
        except StandinMemoryError as exc:
            return self._fail(cudaError_t.cudaErrorInvalidValue, f"cudaMemsetAsync: {exc}")

        def fill() -> None:
            target[...] = value

        return self._enqueue(stream, fill, "cudaMemsetAsync")

    # --- installation ------------------------------------------------------------------------------------------------
    def as_module(self) -> types.ModuleType:
        """A module object exposing the API under CUDA's names (what `from cuda.bindings import runtime` returns)."""
        module = types.ModuleType("cuda.bindings.runtime", "Host-memory stand-in (devtools.trt_standins.cuda_host)")
        module.cudaError_t, module.cudaMemcpyKind = cudaError_t, cudaMemcpyKind
        for name in dir(self):
            if name.startswith("cuda"):
                setattr(module, name, getattr(self, name))
        module.standin = self
        return module


class HostMemory:
    """What the TensorRT stand-in reads and writes through, over a HostCudaRuntime."""

    def __init__(self, runtime: HostCudaRuntime) -> None:
        self.runtime = runtime

    def synchronize(self, stream: int) -> None:
        self.runtime.cudaStreamSynchronize(stream)

    def read(self, pointer: int, nbytes: int) -> bytes:
        return self.runtime.read_device(pointer, nbytes)

    def write(self, pointer: int, data: bytes) -> None:
        self.runtime.write_device(pointer, data)
