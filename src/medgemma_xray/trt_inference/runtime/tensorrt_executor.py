"""Runs a bundle's serialized TensorRT engines on an NVIDIA GPU (tensorrt or tensorrt_rtx module).

Device buffers are sized for the manifest's largest shapes and allocated once; host staging is pinned; all work
runs on one CUDA stream; the KV cache never leaves the GPU. The decoder reads each layer's cache where it lies, at
its capacity (manifest format 2, engine_bundle/kv_layout.py), and returns only the new tokens' rows, into one
scratch set shared by every slot (runs take the executor's lock); one pitched copy per layer and kind writes them
into the cache. Each slot has two buffer sets: growing the capacity (every KV_BLOCK tokens) re-lays the cache
into the other set and swaps; truncating only shortens the rows in use.

Every engine's I/O (names, modes, types, profile ranges) is checked against the manifest at load; every
set_input_shape / set_tensor_address / execute_async_v3 result is checked; a construction that fails part-way
frees what it had allocated. Exercised in CI against devtools.trt_standins (TensorRT's runtime API running the
bundle's ONNX graphs in ONNX Runtime, and host memory standing in for the GPU) and on an H200 with real CUDA
memory and streams (benchmarks/h200_tensorrt_executor.py); TensorRT's own kernels are what neither runs.
"""

from __future__ import annotations

import importlib
import logging
import threading
from pathlib import Path

import numpy as np

from medgemma_xray.engine_bundle.defaults import DEFAULT_SEQUENCE_SLOTS
from medgemma_xray.engine_bundle.kv_layout import KV_BLOCK, capacity_for, masks_over_capacity
from medgemma_xray.engine_bundle.names import KV_KINDS, past_name, present_name, runtime_module
from medgemma_xray.trt_inference.runtime.cuda_memory import (
    CudaStream,
    DeviceBuffer,
    PinnedBuffer,
    copy_device_to_device_2d,
    copy_device_to_host,
    copy_host_to_device,
    memset_async,
)
from medgemma_xray.trt_inference.runtime.slots import DEFAULT_SLOT_TIMEOUT_S, SlotPool

logger = logging.getLogger(__name__)


class EngineLoadError(RuntimeError):
    """TensorRT could not deserialize or prepare an engine; the message carries TensorRT's own log."""


class EngineExecutionError(RuntimeError):
    """TensorRT refused a shape or an address, or an execution failed; the message names the tensor."""


def _capturing_logger(trt):
    class CapturingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[str] = []

        def log(self, severity, message) -> None:
            self.lines.append(f"[{severity}] {message}")
            if severity <= trt.ILogger.Severity.WARNING:
                logger.warning("TensorRT: %s", message)

        def text(self) -> str:
            return "\n".join(self.lines[-40:])

    return CapturingLogger()


def _stream_pointer(handle) -> int:
    """execute_async_v3 takes the stream as an integer; cuda-python's cudaStream_t converts with int() or getPtr()."""
    try:
        return int(handle)
    except TypeError:
        return int(handle.getPtr())


def expected_io(graph: str, layers: int) -> dict[str, tuple[str, str]]:
    """name -> (mode, dtype) of each graph's I/O tensors, as medgemma_xray.engine_build.graphs exports them (I/O kept fp32)."""
    if graph == "vision":
        return {"pixel_values": ("INPUT", "FLOAT"), "image_embeds": ("OUTPUT", "FLOAT")}
    if graph == "embed":
        return {"input_ids": ("INPUT", "INT64"), "inputs_embeds": ("OUTPUT", "FLOAT")}
    io = {
        "inputs_embeds": ("INPUT", "FLOAT"),
        "position_ids": ("INPUT", "INT64"),
        "full_mask": ("INPUT", "FLOAT"),
        "sliding_mask": ("INPUT", "FLOAT"),
        "logits": ("OUTPUT", "FLOAT"),
    }
    for layer in range(layers):
        for kind in KV_KINDS:
            io[past_name(kind, layer)] = ("INPUT", "FLOAT")
            io[present_name(kind, layer)] = ("OUTPUT", "FLOAT")
    return io


class TensorRTExecutor:
    name = "tensorrt"

    def __init__(self, bundle_dir: Path, manifest: dict, sequence_slots: int = DEFAULT_SEQUENCE_SLOTS) -> None:
        # Everything close() releases exists before the first thing that can fail.
        self._buffers: list = []
        self.stream: CudaStream | None = None
        self.engines: dict = {}
        self._contexts: list = []
        self._closed = False
        try:
            self._open(Path(bundle_dir), manifest, sequence_slots)
        except BaseException:
            try:
                self.close()
            except Exception:  # the first error is the one to report
                logger.exception("cleaning up after a failed TensorRT executor start")
            raise

    def _open(self, bundle_dir: Path, manifest: dict, sequence_slots: int) -> None:
        module = runtime_module(manifest)
        self.trt = trt = importlib.import_module(module)
        self.log = _capturing_logger(trt)
        self.runtime = trt.Runtime(self.log)
        shapes = manifest["shapes"]
        self.hidden, self.vocab = shapes["hidden"], shapes["vocab"]
        self.layers, self.kv_heads, self.head_dim = shapes["layers"], shapes["kv_heads"], shapes["head_dim"]
        self.max_sequence, self.max_batch = shapes["max_sequence"], shapes["max_batch"]
        self.image_tokens, self.image_size = shapes["image_tokens"], shapes["image_size"]
        for graph, entry in manifest["graphs"].items():
            plan = bundle_dir / entry["engine"]
            engine = self.runtime.deserialize_cuda_engine(plan.read_bytes())
            if engine is None:
                raise EngineLoadError(f"TensorRT could not deserialize {plan}. TensorRT said:\n{self.log.text()}")
            self.engines[graph] = engine
            self._check_io(graph, engine, plan)
        self._check_profiles()
        self.stream = CudaStream()
        self.lock = threading.Lock()  # one stream: one enqueue+synchronize at a time
        self.vision_context = self._context("vision")
        self.embed_context = self._context("embed")
        self.vision_in = self._device((self.max_batch, 3, self.image_size, self.image_size), np.float32)
        self.vision_out = self._device((self.max_batch, self.image_tokens, self.hidden), np.float32)
        self.vision_host = self._pinned((self.max_batch, self.image_tokens, self.hidden), np.float32)
        self.pixels_host = self._pinned((self.max_batch, 3, self.image_size, self.image_size), np.float32)
        self.ids_in = self._device((1, self.max_sequence), np.int64)
        self.ids_host = self._pinned((1, self.max_sequence), np.int64)
        self.embed_out = self._device((1, self.max_sequence, self.hidden), np.float32)
        self.embed_host = self._pinned((1, self.max_sequence, self.hidden), np.float32)
        self.max_rows = self.max_sequence + 1  # the dead slot, then at most max_sequence tokens
        new_rows_shape = (1, self.kv_heads, self.max_sequence, self.head_dim)
        self.new_rows = [self._device(new_rows_shape, np.float32) for _ in range(2 * self.layers)]
        self.slots: SlotPool[_DecoderSlot] = SlotPool([_DecoderSlot(self) for _ in range(sequence_slots)])
        self.open_stream.synchronize()  # the slots' caches are zeroed before any run reads them

    # --- load-time checks ---------------------------------------------------------------------------------------
    def _check_io(self, graph: str, engine, plan: Path) -> None:
        trt = self.trt
        expected = expected_io(graph, self.layers)
        found = {}
        for index in range(engine.num_io_tensors):
            name = engine.get_tensor_name(index)
            mode = "INPUT" if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else "OUTPUT"
            found[name] = (mode, engine.get_tensor_dtype(name).name)
        if found != expected:
            missing = sorted(set(expected) - set(found))
            extra = sorted(set(found) - set(expected))
            wrong = sorted(n for n in set(found) & set(expected) if found[n] != expected[n])
            raise EngineLoadError(
                f"the {graph} plan {plan} does not have the I/O its graph has (missing {missing}, unexpected "
                f"{extra}, wrong mode or type {[(n, found[n], expected[n]) for n in wrong]}); rebuild the bundle"
            )

    def _profile_max(self, graph: str, name: str) -> tuple[int, ...]:
        return tuple(self.engines[graph].get_tensor_profile_shape(name, 0)[2])

    def _check_profiles(self) -> None:
        """The plans must accept the largest shapes the manifest promises, or requests would fail at run time."""
        checks = (
            ("vision", "pixel_values", 0, self.max_batch, "images in one vision batch"),
            ("embed", "input_ids", 1, self.max_sequence, "tokens"),
            ("decoder", "inputs_embeds", 1, self.max_sequence, "new tokens in one prefill"),
            ("decoder", past_name("key", 0), 2, self.max_sequence + 1, "cache rows (the dead slot included)"),
        )
        for graph, name, axis, needed, what in checks:
            allowed = self._profile_max(graph, name)[axis]
            if allowed < needed:
                raise EngineLoadError(
                    f"the {graph} plan's profile allows at most {allowed} {what} ({name}), the manifest promises "
                    f"{needed}; rebuild the bundle"
                )

    # --- allocation ----------------------------------------------------------------------------------------------
    def _context(self, graph: str):
        context = self.engines[graph].create_execution_context()
        if context is None:
            raise EngineLoadError(f"could not create an execution context for {graph}:\n{self.log.text()}")
        self._contexts.append(context)
        return context

    def _device(self, shape, dtype) -> DeviceBuffer:
        buffer = DeviceBuffer(int(np.prod(shape)) * np.dtype(dtype).itemsize)
        self._buffers.append(buffer)
        return buffer

    def _pinned(self, shape, dtype) -> PinnedBuffer:
        buffer = PinnedBuffer(int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype)
        self._buffers.append(buffer)
        return buffer

    # --- execution -------------------------------------------------------------------------------------------------
    def _execute(self, context, inputs: dict, outputs: dict) -> None:
        """inputs: name -> (device buffer, shape, dtype); outputs: name -> (device buffer, dtype). Caller holds the lock."""
        if self._closed:
            raise EngineExecutionError("the TensorRT executor is closed")
        for name, (buffer, shape, dtype) in inputs.items():
            shape = tuple(int(d) for d in shape)
            if not context.set_input_shape(name, shape):
                raise EngineExecutionError(
                    f"TensorRT refused shape {shape} for {name}: outside the engine's profile:\n{self.log.text()}"
                )
            _require_room(name, shape, dtype, buffer)
            if not context.set_tensor_address(name, int(buffer.pointer)):
                raise EngineExecutionError(f"TensorRT refused the address of input {name}:\n{self.log.text()}")
        for name, (buffer, dtype) in outputs.items():
            _require_room(name, tuple(context.get_tensor_shape(name)), dtype, buffer)
            if not context.set_tensor_address(name, int(buffer.pointer)):
                raise EngineExecutionError(f"TensorRT refused the address of output {name}:\n{self.log.text()}")
        if not context.execute_async_v3(_stream_pointer(self.open_stream.handle)):
            raise EngineExecutionError(f"TensorRT execution failed:\n{self.log.text()}")

    def vision(self, pixel_values: np.ndarray) -> np.ndarray:
        """Image embeddings; batches above the plan's max_batch run in chunks of max_batch."""
        return np.concatenate(
            [
                self._vision_chunk(pixel_values[start : start + self.max_batch])
                for start in range(0, pixel_values.shape[0], self.max_batch)
            ]
        )

    def _vision_chunk(self, pixel_values: np.ndarray) -> np.ndarray:
        batch = pixel_values.shape[0]
        with self.lock:
            staged = self.pixels_host.view(pixel_values.shape)
            staged[...] = pixel_values
            copy_host_to_device(self.vision_in, staged, self.open_stream)
            self._execute(
                self.vision_context,
                {"pixel_values": (self.vision_in, pixel_values.shape, np.float32)},
                {"image_embeds": (self.vision_out, np.float32)},
            )
            result = self.vision_host.view((batch, self.image_tokens, self.hidden))
            copy_device_to_host(result, self.vision_out, self.open_stream)
            self.open_stream.synchronize()
            return result.copy()

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        if input_ids.shape[0] != 1 or input_ids.shape[1] > self.max_sequence:
            raise ValueError(f"embed takes (1, <= {self.max_sequence}) ids, got {input_ids.shape}")
        with self.lock:
            staged = self.ids_host.view(input_ids.shape)
            staged[...] = input_ids
            copy_host_to_device(self.ids_in, staged, self.open_stream)
            self._execute(
                self.embed_context,
                {"input_ids": (self.ids_in, input_ids.shape, np.int64)},
                {"inputs_embeds": (self.embed_out, np.float32)},
            )
            result = self.embed_host.view((*input_ids.shape, self.hidden))
            copy_device_to_host(result, self.embed_out, self.open_stream)
            self.open_stream.synchronize()
            return result.copy()

    def new_sequence(self, timeout_s: float | None = DEFAULT_SLOT_TIMEOUT_S) -> _TensorRTSequence:
        """A sequence on a free decoder slot; raises medgemma_xray.inference_api.errors.NoFreeSlotError if none frees up in time."""
        if self._closed:
            raise EngineExecutionError("the TensorRT executor is closed")
        return _TensorRTSequence(self, self.slots.acquire(timeout_s))

    @property
    def open_stream(self) -> CudaStream:
        """The executor's one stream (made in __init__, after everything that close() must free exists)."""
        if self.stream is None:
            raise RuntimeError("The TensorRT executor has no CUDA stream: its __init__ failed before making one.")
        return self.stream

    def close(self) -> None:
        """Free every buffer, the stream, the contexts and the engines. Idempotent; safe after a failed __init__."""
        self._closed = True
        errors = []
        for buffer in self._buffers:
            try:
                buffer.free()
            except Exception as exc:  # free the rest regardless, then report
                errors.append(exc)
        self._buffers.clear()
        if self.stream is not None:
            try:
                self.stream.close()
            except Exception as exc:
                errors.append(exc)
        self._contexts.clear()
        self.engines.clear()
        if errors:
            raise RuntimeError(f"{len(errors)} CUDA resources could not be freed: {errors[0]}")


def _require_room(name: str, shape: tuple, dtype, buffer) -> None:
    if any(d < 0 for d in shape):
        raise EngineExecutionError(f"TensorRT could not resolve the shape of {name}: {shape}")
    needed = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if needed > buffer.nbytes:
        raise EngineExecutionError(f"{name} of shape {shape} needs {needed} bytes; its buffer has {buffer.nbytes}")


class _DecoderSlot:
    """Everything one running conversation needs on the GPU, allocated once per slot. Mask buffers hold a prefill's
    keys at the cache's capacity, which runs at most KV_BLOCK - 1 rows past what the cache holds."""

    def __init__(self, executor: TensorRTExecutor) -> None:
        e = executor
        keys = e.max_rows + KV_BLOCK
        self.context = e._context("decoder")
        self.embeds = e._device((1, e.max_sequence, e.hidden), np.float32)
        self.positions = e._device((1, e.max_sequence), np.int64)
        self.full_mask = e._device((1, 1, e.max_sequence, keys), np.float32)
        self.sliding_mask = e._device((1, 1, e.max_sequence, keys), np.float32)
        self.logits = e._device((1, 1, e.vocab), np.float32)
        self.logits_host = e._pinned((1, 1, e.vocab), np.float32)
        self.host = {
            "inputs_embeds": e._pinned((1, e.max_sequence, e.hidden), np.float32),
            "position_ids": e._pinned((1, e.max_sequence), np.int64),
            "full_mask": e._pinned((1, 1, e.max_sequence, keys), np.float32),
            "sliding_mask": e._pinned((1, 1, e.max_sequence, keys), np.float32),
        }
        kv_shape = (1, e.kv_heads, e.max_rows, e.head_dim)
        self.kv = [[e._device(kv_shape, np.float32) for _ in range(2 * e.layers)] for _ in range(2)]
        for buffer in self.kv[0] + self.kv[1]:  # masked rows are read too: they must hold finite values
            memset_async(buffer, 0, buffer.nbytes, e.open_stream)


class _TensorRTSequence:
    """One conversation on a decoder slot: its cache is (1, heads, capacity, dim) per layer and kind in one of the
    slot's two buffer sets, the dead slot (row 0) then one row per token."""

    def __init__(self, executor: TensorRTExecutor, slot: _DecoderSlot) -> None:
        self.executor = executor
        self.slot: _DecoderSlot | None = slot  # None once closed
        self.length = 0  # rows in use: 0 before the first run, then the dead slot (zeros) plus one per token
        self.capacity = 0
        self.current = 0  # which of the two KV buffer sets holds the cache

    @property
    def past_length(self) -> int:
        """Tokens in the cache, the dead slot not counted."""
        return max(0, self.length - 1)

    def run(self, inputs_embeds, position_ids, full_mask, sliding_mask) -> np.ndarray:
        if self.slot is None:
            raise RuntimeError("this sequence was closed")
        e, slot = self.executor, self.slot
        new, total = inputs_embeds.shape[1], full_mask.shape[-1]
        if inputs_embeds.shape[0] != 1:
            raise ValueError(f"the TensorRT executor runs one sequence at a time, got batch {inputs_embeds.shape[0]}")
        if total > e.max_rows:
            raise ValueError(f"conversation of {total - 1} tokens exceeds the engine's maximum {e.max_sequence}")
        if 1 + self.past_length + new != total:
            raise ValueError(f"mask covers {total} keys, but the cache holds 1 + {self.past_length} plus {new} new")
        with e.lock:
            if self.length == 0:
                self.length, self.capacity = 1, capacity_for(1, e.max_rows)  # grows after the run
            feeds = {
                "inputs_embeds": (inputs_embeds, np.float32),
                "position_ids": (position_ids, np.int64),
                "full_mask": (masks_over_capacity(full_mask, self.length, self.capacity), np.float32),
                "sliding_mask": (masks_over_capacity(sliding_mask, self.length, self.capacity), np.float32),
            }
            device = {
                "inputs_embeds": slot.embeds,
                "position_ids": slot.positions,
                "full_mask": slot.full_mask,
                "sliding_mask": slot.sliding_mask,
            }
            inputs = {}
            for name, (value, dtype) in feeds.items():
                staged = slot.host[name].view(value.shape)
                staged[...] = value.astype(dtype, copy=False)
                copy_host_to_device(device[name], staged, e.open_stream)
                inputs[name] = (device[name], value.shape, dtype)
            cache = slot.kv[self.current]
            kv_shape = (1, e.kv_heads, self.capacity, e.head_dim)
            outputs = {"logits": (slot.logits, np.float32)}
            for index in range(e.layers):
                for offset, kind in enumerate(KV_KINDS):
                    inputs[past_name(kind, index)] = (cache[2 * index + offset], kv_shape, np.float32)
                    outputs[present_name(kind, index)] = (e.new_rows[2 * index + offset], np.float32)
            e._execute(slot.context, inputs, outputs)
            logits = slot.logits_host.view((1, 1, e.vocab))
            copy_device_to_host(logits, slot.logits, e.open_stream)
            if self.length + new > self.capacity:
                self._relayout(capacity_for(self.length + new, e.max_rows))
            row = e.head_dim * 4
            for target, rows in zip(slot.kv[self.current], e.new_rows, strict=True):
                copy_device_to_device_2d(
                    target,
                    self.capacity * row,
                    rows,
                    new * row,
                    new * row,
                    e.kv_heads,
                    e.open_stream,
                    self.length * row,
                )
            e.open_stream.synchronize()
            self.length += new
            return logits[:, -1].copy()

    def _relayout(self, capacity: int) -> None:
        """Move the rows in use to the other buffer set at a new capacity, one pitched copy per layer and kind, and
        swap. Caller holds the lock."""
        e, slot = self.executor, self.slot
        assert slot is not None
        row = e.head_dim * 4
        for source, target in zip(slot.kv[self.current], slot.kv[1 - self.current], strict=True):
            copy_device_to_device_2d(
                target, capacity * row, source, self.capacity * row, self.length * row, e.kv_heads, e.open_stream
            )
        self.current, self.capacity = 1 - self.current, capacity

    def truncate(self, past_length: int) -> None:
        """Keep the first past_length tokens (and the dead slot). The rows after them stay where they are, masked,
        until new tokens overwrite them; the capacity shrinks to fit (re-laying the kept rows) when it is a block
        or more too large, so that a run never reads more than KV_BLOCK - 1 unused rows and its masks fit the
        slot's mask buffers."""
        if self.slot is None:
            raise RuntimeError("this sequence was closed")
        if not 0 <= past_length <= self.past_length:
            raise ValueError(f"cannot truncate a cache of {self.past_length} tokens to {past_length}")
        if not self.length:
            return
        self.length = past_length + 1
        fitting = capacity_for(self.length, self.executor.max_rows)
        if fitting < self.capacity:
            with self.executor.lock:
                self._relayout(fitting)
                self.executor.open_stream.synchronize()

    def close(self) -> None:
        """Give the slot back. Idempotent."""
        if self.slot is not None:
            slot, self.slot = self.slot, None
            self.executor.slots.release(slot)
