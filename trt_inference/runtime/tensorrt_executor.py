"""Runs a bundle's serialized TensorRT engines on an NVIDIA GPU (tensorrt or tensorrt_rtx module).

Device buffers are sized for the manifest's largest shapes and allocated once; host staging is pinned; all work
runs on one CUDA stream; the KV cache never leaves the GPU (two buffers per layer, swapped after each step, so
the present KV of one step is the past KV of the next without a copy).

Could not be executed where this was written (no TensorRT-capable GPU: TensorRT-RTX refuses compute capability
9.0, full TensorRT cannot be installed). It follows the TensorRT 10/11 Python API: deserialize_cuda_engine,
set_input_shape, set_tensor_address, execute_async_v3.
"""

from __future__ import annotations

import importlib
import logging
import queue
import threading
from pathlib import Path

import numpy as np

from trt_inference.runtime.cuda_memory import (
    CudaStream,
    DeviceBuffer,
    PinnedBuffer,
    copy_device_to_host,
    copy_host_to_device,
    cuda_call,
)

logger = logging.getLogger(__name__)


class EngineLoadError(RuntimeError):
    """TensorRT could not deserialize or prepare an engine; the message carries TensorRT's own log."""


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


class TensorRTExecutor:
    name = "tensorrt"

    def __init__(self, bundle_dir: Path, manifest: dict, sequence_slots: int = 2) -> None:
        module = "tensorrt_rtx" if manifest["tensorrt"]["target"] == "tensorrt-rtx" else "tensorrt"
        self.trt = trt = importlib.import_module(module)
        self.log = _capturing_logger(trt)
        self.runtime = trt.Runtime(self.log)
        self.engines = {}
        for graph, entry in manifest["graphs"].items():
            plan = Path(bundle_dir) / entry["engine"]
            engine = self.runtime.deserialize_cuda_engine(plan.read_bytes())
            if engine is None:
                raise EngineLoadError(f"TensorRT could not deserialize {plan}. TensorRT said:\n{self.log.text()}")
            self.engines[graph] = engine
        shapes = manifest["shapes"]
        self.hidden, self.vocab = shapes["hidden"], shapes["vocab"]
        self.layers, self.kv_heads, self.head_dim = shapes["layers"], shapes["kv_heads"], shapes["head_dim"]
        self.max_sequence, self.max_batch = shapes["max_sequence"], shapes["max_batch"]
        self.image_tokens, self.image_size = shapes["image_tokens"], shapes["image_size"]
        self.stream = CudaStream()
        self.lock = threading.Lock()  # one stream: one enqueue+synchronize at a time
        self._buffers: list = []
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
        self.slots: queue.Queue = queue.Queue()
        for _ in range(sequence_slots):
            self.slots.put(_DecoderSlot(self))

    def _context(self, graph: str):
        context = self.engines[graph].create_execution_context()
        if context is None:
            raise EngineLoadError(f"could not create an execution context for {graph}:\n{self.log.text()}")
        return context

    def _device(self, shape, dtype) -> DeviceBuffer:
        buffer = DeviceBuffer(int(np.prod(shape)) * np.dtype(dtype).itemsize)
        self._buffers.append(buffer)
        return buffer

    def _pinned(self, shape, dtype) -> PinnedBuffer:
        buffer = PinnedBuffer(int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype)
        self._buffers.append(buffer)
        return buffer

    def _execute(self, context, inputs: dict, outputs: dict) -> None:
        """inputs: name -> (device buffer, shape); outputs: name -> device buffer. Caller holds the lock."""
        for name, (buffer, shape) in inputs.items():
            if not context.set_input_shape(name, tuple(int(d) for d in shape)):
                raise RuntimeError(f"TensorRT refused shape {tuple(shape)} for {name}: outside the engine's profile")
            context.set_tensor_address(name, int(buffer.pointer))
        for name, buffer in outputs.items():
            context.set_tensor_address(name, int(buffer.pointer))
        if not context.execute_async_v3(self.stream.handle):
            raise RuntimeError(f"TensorRT execution failed:\n{self.log.text()}")

    def vision(self, pixel_values: np.ndarray) -> np.ndarray:
        batch = pixel_values.shape[0]
        if batch > self.max_batch:
            raise ValueError(f"batch {batch} exceeds the engine's maximum {self.max_batch}")
        with self.lock:
            staged = self.pixels_host.view(pixel_values.shape)
            staged[...] = pixel_values
            copy_host_to_device(self.vision_in, staged, self.stream)
            self._execute(self.vision_context, {"pixel_values": (self.vision_in, pixel_values.shape)},
                          {"image_embeds": self.vision_out})  # fmt: skip
            result = self.vision_host.view((batch, self.image_tokens, self.hidden))
            copy_device_to_host(result, self.vision_out, self.stream)
            self.stream.synchronize()
            return result.copy()

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        with self.lock:
            staged = self.ids_host.view(input_ids.shape)
            staged[...] = input_ids
            copy_host_to_device(self.ids_in, staged, self.stream)
            self._execute(
                self.embed_context, {"input_ids": (self.ids_in, input_ids.shape)}, {"inputs_embeds": self.embed_out}
            )
            result = self.embed_host.view((*input_ids.shape, self.hidden))
            copy_device_to_host(result, self.embed_out, self.stream)
            self.stream.synchronize()
            return result.copy()

    def new_sequence(self) -> _TensorRTSequence:
        return _TensorRTSequence(self, self.slots.get())

    def close(self) -> None:
        for buffer in self._buffers:
            buffer.free()
        self._buffers.clear()
        self.stream.close()
        self.engines.clear()


class _DecoderSlot:
    """Everything one running conversation needs on the GPU, allocated once per slot."""

    def __init__(self, executor: TensorRTExecutor) -> None:
        e = executor
        total = e.max_sequence + 1  # plus the dead slot
        self.context = e._context("decoder")
        self.embeds = e._device((1, e.max_sequence, e.hidden), np.float32)
        self.positions = e._device((1, e.max_sequence), np.int64)
        self.full_mask = e._device((1, 1, e.max_sequence, total), np.float32)
        self.sliding_mask = e._device((1, 1, e.max_sequence, total), np.float32)
        self.logits = e._device((1, 1, e.vocab), np.float32)
        self.logits_host = e._pinned((1, 1, e.vocab), np.float32)
        self.host = {
            "inputs_embeds": e._pinned((1, e.max_sequence, e.hidden), np.float32),
            "position_ids": e._pinned((1, e.max_sequence), np.int64),
            "full_mask": e._pinned((1, 1, e.max_sequence, total), np.float32),
            "sliding_mask": e._pinned((1, 1, e.max_sequence, total), np.float32),
        }
        kv_shape = (1, e.kv_heads, total, e.head_dim)
        self.kv = [[e._device(kv_shape, np.float32) for _ in range(2 * e.layers)] for _ in range(2)]


class _TensorRTSequence:
    def __init__(self, executor: TensorRTExecutor, slot: _DecoderSlot) -> None:
        self.executor, self.slot = executor, slot
        self.past_length = 0
        self.current = 0  # which of the two KV buffer sets holds the past

    def run(self, inputs_embeds, position_ids, full_mask, sliding_mask) -> np.ndarray:
        e, slot = self.executor, self.slot
        new, total = inputs_embeds.shape[1], full_mask.shape[-1]
        if total > e.max_sequence + 1:
            raise ValueError(f"conversation of {total - 1} tokens exceeds the engine's maximum {e.max_sequence}")
        with e.lock:
            if self.past_length == 0:  # the dead slot: zeros at KV position 0
                from trt_inference.runtime.cuda_memory import _cudart

                nbytes = e.kv_heads * e.head_dim * 4  # shape (1, kv_heads, 1, head_dim), contiguous
                for buffer in slot.kv[self.current]:
                    cuda_call(_cudart().cudaMemsetAsync(buffer.pointer, 0, nbytes, e.stream.handle))
                self.past_length = 1
            if self.past_length + new != total:
                raise ValueError(
                    f"mask covers {total} keys, but the cache holds {self.past_length} plus {new} new tokens"
                )
            feeds = {"inputs_embeds": inputs_embeds.astype(np.float32), "position_ids": position_ids.astype(np.int64),
                     "full_mask": full_mask, "sliding_mask": sliding_mask}  # fmt: skip
            device = {"inputs_embeds": slot.embeds, "position_ids": slot.positions, "full_mask": slot.full_mask,
                      "sliding_mask": slot.sliding_mask}  # fmt: skip
            inputs = {}
            for name, value in feeds.items():
                staged = slot.host[name].view(value.shape)
                staged[...] = value
                copy_host_to_device(device[name], staged, e.stream)
                inputs[name] = (device[name], value.shape)
            past, present = slot.kv[self.current], slot.kv[1 - self.current]
            kv_shape = (1, e.kv_heads, self.past_length, e.head_dim)
            outputs = {"logits": slot.logits}
            for index in range(e.layers):
                for offset, kind in enumerate(("key", "value")):
                    inputs[f"past_{kind}_{index}"] = (past[2 * index + offset], kv_shape)
                    outputs[f"present_{kind}_{index}"] = present[2 * index + offset]
            e._execute(slot.context, inputs, outputs)
            logits = slot.logits_host.view((1, 1, e.vocab))
            copy_device_to_host(logits, slot.logits, e.stream)
            e.stream.synchronize()
            self.current, self.past_length = 1 - self.current, total
            return logits[:, -1].copy()

    def close(self) -> None:
        if self.slot is not None:
            self.executor.slots.put(self.slot)
            self.slot = None
