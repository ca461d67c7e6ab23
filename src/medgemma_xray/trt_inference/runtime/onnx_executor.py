"""Runs a bundle's ONNX graphs (the same graphs TensorRT builds from, Q/DQ included) with ONNX Runtime on CPU.

This is how CI and CPU hosts exercise the exact graphs of an engine bundle. Same sequence API as the TensorRT
executor: slots lent with a timeout, run / truncate / past_length, vision batches split by max_batch. Decode
steps of several sequences run as one batch (`decode_batch`): pasts padded to one length with masked keys.

The KV cache lives in buffers this executor allocates once (kv_store.py): one store per slot, and one for the
running decode batch. Each decoder run binds them where they lie (ONNX Runtime IO binding by address), gets back
only the new tokens' rows (manifest format 2, engine_bundle/kv_layout.py) and writes those in. So a decode step
copies one row per sequence, where format 1 copied every sequence's whole past into a new output every step.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from medgemma_xray.engine_bundle.defaults import DEFAULT_SEQUENCE_SLOTS
from medgemma_xray.engine_bundle.kv_layout import capacity_for, masks_over_capacity
from medgemma_xray.engine_bundle.manifest import ManifestError, rebuild_command
from medgemma_xray.engine_bundle.names import KV_KINDS, kv_input_names, present_name
from medgemma_xray.trt_inference.runtime.kv_store import KvStore
from medgemma_xray.trt_inference.runtime.slots import DEFAULT_SLOT_TIMEOUT_S, SlotPool

# ORT_ENABLE_ALL's SimplifiedLayerNormFusion breaks on fp16/bf16 graphs; EXTENDED runs them. Above BASIC, ORT
# fuses fp8 Q/DQ into MatMulIntegerToFloat, which rejects float8; BASIC runs the Q/DQ nodes as written.
OPTIMIZATION_LEVELS = {
    "fp32": "ORT_ENABLE_ALL",
    "int8": "ORT_ENABLE_ALL",
    "fp16": "ORT_ENABLE_EXTENDED",
    "bf16": "ORT_ENABLE_EXTENDED",
    "fp8": "ORT_ENABLE_BASIC",
}

# ONNX Runtime's CPU arena keeps every chunk it was extended by until its session closes. A prefill's attention
# over the prompt is quadratic in its length, so one 1,884-token prompt of the demo bundle left the arena 385 MiB
# of chunks and the process 148 MiB more RSS, held for the bundle's lifetime; each bundle session then sat at the
# high-water mark of the longest prompt it had seen (the 60-minute soak's RSS growth, benchmarks/bundle_rss.py).
# This run option hands the arena's free chunks back after the run that asked. Asked after prompt runs and vision
# runs only: they are where the peak is and come once per prompt chunk or film, so the chunks are mapped again once
# per prompt, not once per decoded token (decode steps stay in the arena's initial chunk).
ARENA_SHRINK_ENTRY = ("memory.enable_memory_arena_shrinkage", "cpu:0")


def shrink_after_run():
    """RunOptions that give the CPU arena's unused chunks back to the system when the run ends."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry(*ARENA_SHRINK_ENTRY)
    return options


def cpu_threads() -> int:
    """ONNX Runtime's threads: OMP_NUM_THREADS where the operator set it (torch and numpy read it too; ONNX Runtime
    does not), else the cores this process may run on (a container's or taskset's share, not the host's count)."""
    configured = os.environ.get("OMP_NUM_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, len(os.sched_getaffinity(0)))


def _session(path: Path, options, manifest: dict):
    """One graph's session. A graph ONNX Runtime cannot parse is a configuration error (a truncated or damaged
    file, sealed again by hand): the same bytes fail the same way at every restart."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph, InvalidProtobuf

    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except (InvalidProtobuf, InvalidGraph) as exc:
        raise ManifestError(
            f"ONNX Runtime cannot load {path} ({str(exc).strip()}): the graph is damaged, although it matches the "
            f"hash its manifest records (a manifest sealed again after the file changed). Rebuild the bundle: "
            f"{rebuild_command(manifest)}"
        ) from exc


class OnnxRuntimeExecutor:
    name = "onnxruntime-cpu"

    def __init__(
        self, bundle_dir: Path, manifest: dict, sequence_slots: int = DEFAULT_SEQUENCE_SLOTS, threads: int | None = None
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or cpu_threads()
        self.optimization_level = OPTIMIZATION_LEVELS.get(manifest["precision"], "ORT_ENABLE_BASIC")
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.optimization_level)
        self.sessions = {}
        for graph, entry in manifest["graphs"].items():
            self.sessions[graph] = _session(Path(bundle_dir) / entry["onnx"], options, manifest)
        shapes = manifest["shapes"]
        self.layers, self.kv_heads, self.head_dim = shapes["layers"], shapes["kv_heads"], shapes["head_dim"]
        self.max_batch, self.max_sequence = shapes["max_batch"], shapes["max_sequence"]
        self.max_rows = self.max_sequence + 1  # the dead slot, then at most max_sequence tokens
        self.kv_input_names = kv_input_names(self.layers)
        self.kv_output_names = [present_name(kind, layer) for layer in range(self.layers) for kind in KV_KINDS]
        tensors = len(self.kv_input_names)
        self.slots: SlotPool[KvStore] = SlotPool(
            [KvStore(tensors, 1, self.kv_heads, self.head_dim, self.max_rows) for _ in range(sequence_slots)]
        )
        self.batch_store = KvStore(tensors, sequence_slots, self.kv_heads, self.head_dim, self.max_rows)
        self._bindings: dict[int, tuple] = {}  # id(store) -> (IO binding of its buffers, (batch, capacity) bound)
        self._batch: _DecodeBatch | None = None
        self.shrink_after = shrink_after_run()  # for the runs whose peak is large: prompts and films

    def vision(self, pixel_values: np.ndarray) -> np.ndarray:
        """Image embeddings; batches above the bundle's max_batch run in chunks, as on TensorRT."""
        session = self.sessions["vision"]
        chunks = [
            session.run(
                None,
                {"pixel_values": pixel_values[start : start + self.max_batch].astype(np.float32)},
                self.shrink_after,
            )[0]
            for start in range(0, pixel_values.shape[0], self.max_batch)
        ]
        return np.concatenate(chunks)

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        return self.sessions["embed"].run(None, {"input_ids": input_ids.astype(np.int64)})[0]

    def run_decoder(self, store: KvStore, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """One decoder run over the cache in `store` and the step's other inputs (embeds, positions, masks): float32
        logits of the last token (batch, vocab) and the new tokens' KV rows per layer and kind.

        The store's buffers are bound by address (ONNX Runtime IO binding), once per store, capacity and number of
        new tokens: a decode step rebinds only its four small inputs, and the past is read where the store keeps it.
        Only the outputs, the logits and the new rows, are written (then copied out: they are small)."""
        session = self.sessions["decoder"]
        shape = (store.batch, store.capacity, inputs["inputs_embeds"].shape[1])
        binding, bound_shape = self._bindings.get(id(store), (None, None))
        if binding is None or bound_shape != shape:
            # Outputs too: a bound output keeps the shape of its first run (the new rows: 1 on a decode step).
            binding = session.io_binding()
            for name, view in zip(self.kv_input_names, store.views(), strict=True):
                binding.bind_input(name, "cpu", 0, np.float32, list(view.shape), view.ctypes.data)
            binding.bind_output("logits", "cpu")
            for name in self.kv_output_names:
                binding.bind_output(name, "cpu")
            self._bindings[id(store)] = (binding, shape)
        kept = []
        for name, value in inputs.items():
            value = np.ascontiguousarray(value)
            kept.append(value)  # alive until the run is over: bound by address
            binding.bind_input(name, "cpu", 0, value.dtype.type, list(value.shape), value.ctypes.data)
        # A prompt's run peaks with its length (attention over every key): its arena chunks go back after it.
        session.run_with_iobinding(binding, self.shrink_after if inputs["inputs_embeds"].shape[1] > 1 else None)
        logits, *presents = binding.copy_outputs_to_cpu()
        return logits[:, -1].astype(np.float32), presents

    def decode_batch(self, sequences: list[OnnxSequence], inputs_embeds: np.ndarray, sliding_window: int) -> np.ndarray:
        """One new token for each sequence in ONE decoder run with a batch axis; float32 logits (batch, vocab).

        The batch's cache is the executor's batch store: each member's rows are copied in when the batch forms,
        padded to the longest with masked keys (key position -1, as the dead slot), and each row's position is its
        own past length, so a row sees exactly its own tokens: the same logits as running it alone, up to the
        floating-point order of a batched matrix product. While the same sequences decode step after step, each
        step appends one row per sequence to the store and nothing else is copied; a member's rows go back to
        its own slot only when the batch changes or the sequence is used alone."""
        from medgemma_xray.engine_bundle.masks import attention_masks

        batch = self._batch
        if batch is None or batch.members != sequences or any(s.batch is not batch for s in sequences):
            self.flush_batch()
            batch = self._form_batch(sequences)
        store = self.batch_store
        positions = batch.pasts[:, None].copy()
        keys = np.concatenate([batch.key_positions, positions], axis=1)
        full, sliding = attention_masks(positions, keys, sliding_window)
        inputs: dict[str, np.ndarray] = {"inputs_embeds": inputs_embeds.astype(np.float32), "position_ids": positions}
        inputs["full_mask"], inputs["sliding_mask"] = full, sliding
        logits, presents = self.run_decoder(store, inputs)
        if batch.length + 1 > store.capacity:
            batch.grow(capacity_for(batch.length + 1, self.max_rows))
        store.append(batch.length, presents)
        batch.key_positions[:, batch.length] = batch.pasts
        batch.length, batch.pasts = batch.length + 1, batch.pasts + 1
        self._batch = batch
        return logits

    def _form_batch(self, sequences: list[OnnxSequence]) -> _DecodeBatch:
        lengths = [sequence.rows for sequence in sequences]
        longest = max(lengths)
        store = self.batch_store
        store.reshape(len(sequences), capacity_for(longest + 1, self.max_rows))
        key_positions = np.full((len(sequences), store.capacity), -1, dtype=np.int64)
        batch_views = store.views()
        for row, (sequence, length) in enumerate(zip(sequences, lengths, strict=True)):
            key_positions[row, 1:length] = np.arange(length - 1)
            for target, source in zip(batch_views, sequence.store.views(), strict=True):
                target[row, :, :length] = source[0, :, :length] if sequence.length else 0.0  # never run: dead slot
        batch = _DecodeBatch(self, list(sequences), key_positions, longest)
        for sequence in sequences:
            sequence.batch = batch
        return batch

    def flush_batch(self) -> None:
        """Give every member of the running decode batch its own rows back (the batch ends)."""
        batch, self._batch = self._batch, None
        if batch is None:
            return
        for row, sequence in enumerate(batch.members):
            if sequence.batch is batch:
                sequence._take_from_batch(row)

    def new_sequence(self, timeout_s: float | None = DEFAULT_SLOT_TIMEOUT_S) -> OnnxSequence:
        """A sequence on a free slot; raises medgemma_xray.inference_api.errors.NoFreeSlotError if none frees up in time."""
        return OnnxSequence(self, self.slots.acquire(timeout_s))

    def close(self) -> None:
        """Drop the sessions, the IO bindings (each keeps its session alive) and the running decode batch.

        The batch and this executor point at each other, and the batch and its sequences too: left in place, those
        cycles kept the executor, its KV buffers and, through the bindings, every graph's session (about 140 MiB
        of the demo bundle's heap) after the backend closed, until a full garbage collection, which a busy server
        runs rarely. The one-hour soak's RSS stepped up at switches to the bundle and stayed there
        (benchmarks/server_switch_rss.py). Broken here, the bundle's memory goes when its backend does."""
        batch, self._batch = self._batch, None
        if batch is not None:
            for sequence in batch.members:
                sequence.batch = None
            batch.members.clear()
        self._bindings.clear()
        self.sessions.clear()


class _DecodeBatch:
    """The running decode batch: its members in row order, every cached row's key position per member (-1: dead
    slot, padding, or beyond the rows used), the rows used (the same for every member), each member's past length."""

    def __init__(self, executor: OnnxRuntimeExecutor, members: list, key_positions: np.ndarray, length: int) -> None:
        self.executor, self.members, self.key_positions, self.length = executor, members, key_positions, length
        self.pasts = np.asarray([(key_positions[row] >= 0).sum() for row in range(len(members))], dtype=np.int64)

    def grow(self, capacity: int) -> None:
        self.executor.batch_store.reshape(len(self.members), capacity, keep=self.length)
        grown = np.full((len(self.members), capacity), -1, dtype=np.int64)
        grown[:, : self.key_positions.shape[1]] = self.key_positions
        self.key_positions = grown


class OnnxSequence:
    """One conversation's KV cache in its slot's store, (1, kv_heads, capacity, head_dim) per layer and kind: the
    dead slot (row 0), then one row per token. While the sequence is in the executor's running decode batch, its
    rows live in the batch store and are copied back on first use alone."""

    def __init__(self, executor: OnnxRuntimeExecutor, store: KvStore) -> None:
        self.executor = executor
        self.slot: KvStore | None = store  # None once closed
        self.store = store
        self.length = 0  # rows in use: 0 before the first run, then the dead slot plus one per token
        self.batch: _DecodeBatch | None = None

    @property
    def rows(self) -> int:
        """Rows of cache the next run reads (at least the dead slot)."""
        if self.batch is not None:
            self._take_from_batch(self.batch.members.index(self))
        return max(1, self.length)

    def _take_from_batch(self, row: int) -> None:
        batch, self.batch = self.batch, None
        assert batch is not None  # called only while it is in a batch
        valid = np.concatenate([[0], np.flatnonzero(batch.key_positions[row, 1 : batch.length] >= 0) + 1])
        self.store.reshape(1, capacity_for(len(valid), self.executor.max_rows))
        for target, source in zip(self.store.views(), self.executor.batch_store.views(), strict=True):
            target[0, :, : len(valid)] = source[row, :, valid].transpose(1, 0, 2)
        self.length = len(valid)

    @property
    def past_length(self) -> int:
        """Tokens in the cache, the dead slot not counted."""
        if self.batch is not None:
            return int(self.batch.pasts[self.batch.members.index(self)])
        return max(0, self.length - 1)

    def decoder_feeds(self, inputs_embeds, position_ids, full_mask, sliding_mask) -> dict[str, np.ndarray]:
        """The decoder's inputs for the next run, as run() binds them: the masks spread over the cache's capacity,
        and the past as views of the slot's store (the calibration recorder copies them)."""
        feeds = self._step_inputs(inputs_embeds, position_ids, full_mask, sliding_mask)
        feeds.update(zip(self.executor.kv_input_names, self.store.views(), strict=True))
        return feeds

    def _step_inputs(self, inputs_embeds, position_ids, full_mask, sliding_mask) -> dict[str, np.ndarray]:
        if self.slot is None:
            raise RuntimeError("this sequence was closed")
        executor = self.executor
        length, new, total = self.rows, inputs_embeds.shape[1], full_mask.shape[-1]
        if inputs_embeds.shape[0] != 1:
            raise ValueError(f"a sequence runs one conversation, got batch {inputs_embeds.shape[0]}")
        if length + new != total:
            raise ValueError(f"mask covers {total} keys, but the cache holds 1 + {length - 1} plus {new} new")
        if total > executor.max_rows:
            raise ValueError(f"conversation of {total - 1} tokens exceeds the bundle's maximum {executor.max_sequence}")
        if self.length == 0:
            self.store.reshape(1, capacity_for(1, executor.max_rows))  # grows after the run
            for view in self.store.views():
                view[:, :, 0] = 0.0  # the dead slot
            self.length = 1
        capacity = self.store.capacity
        return {
            "inputs_embeds": inputs_embeds.astype(np.float32),
            "position_ids": position_ids.astype(np.int64),
            "full_mask": masks_over_capacity(full_mask, length, capacity),
            "sliding_mask": masks_over_capacity(sliding_mask, length, capacity),
        }

    def run(self, inputs_embeds, position_ids, full_mask, sliding_mask) -> np.ndarray:
        """Append the new tokens to the cache; return float32 logits of the last token, shape (batch, vocab)."""
        inputs = self._step_inputs(inputs_embeds, position_ids, full_mask, sliding_mask)
        logits, presents = self.executor.run_decoder(self.store, inputs)
        new = inputs_embeds.shape[1]
        if self.length + new > self.store.capacity:
            self.store.reshape(1, capacity_for(self.length + new, self.executor.max_rows), keep=self.length)
        self.store.append(self.length, presents)
        self.length += new
        return logits

    def truncate(self, past_length: int) -> None:
        """Keep the first past_length tokens (and the dead slot); the next run continues from there. The rows
        after them stay where they are, masked, until new tokens overwrite them; the capacity shrinks to fit (the
        kept rows re-laid in place) when it is a block or more too large, so a run reads at most KV_BLOCK - 1
        unused rows."""
        if not 0 <= past_length <= self.past_length:
            raise ValueError(f"cannot truncate a cache of {self.past_length} tokens to {past_length}")
        if self.batch is not None:
            self._take_from_batch(self.batch.members.index(self))
        if self.length:
            self.length = past_length + 1
            fitting = capacity_for(self.length, self.executor.max_rows)
            if fitting < self.store.capacity:
                self.store.reshape(1, fitting, keep=self.length)

    def close(self) -> None:
        """Give the slot back. Idempotent."""
        self.batch = None  # leaves the decode batch (its row is skipped when the batch is flushed)
        if self.slot is not None:
            slot, self.slot = self.slot, None
            self.length = 0
            self.executor.slots.release(slot)
