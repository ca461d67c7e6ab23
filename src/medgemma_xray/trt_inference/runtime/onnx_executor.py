"""Runs a bundle's ONNX graphs (the same graphs TensorRT builds from, Q/DQ included) with ONNX Runtime on CPU.

This is how CI and CPU hosts exercise the exact graphs of an engine bundle. Same sequence API as the TensorRT
executor: slots lent with a timeout, run / truncate / past_length, vision batches split by max_batch. Decode
steps of several sequences run as one batch (`decode_batch`): pasts padded to one length with masked keys.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import numpy as np

from medgemma_xray.engine_bundle.defaults import DEFAULT_SEQUENCE_SLOTS
from medgemma_xray.engine_bundle.manifest import ManifestError, rebuild_command
from medgemma_xray.engine_bundle.names import kv_input_names
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
        self.kv_input_names = kv_input_names(self.layers)
        self.slots: SlotPool[int] = SlotPool(list(range(sequence_slots)))
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

    def decode_batch(self, sequences: list[OnnxSequence], inputs_embeds: np.ndarray, sliding_window: int) -> np.ndarray:
        """One new token for each sequence in ONE decoder run with a batch axis; float32 logits (batch, vocab).

        Each row's past is padded to the longest past with masked keys (key position -1, as the dead slot), and
        its position is its own past length, so a row sees exactly its own tokens: the same logits as running it
        alone, up to the floating-point order of a batched matrix product. While the same sequences decode step
        after step, the batch's padded KV (the decoder's own output) is fed straight back, with no copy: each
        sequence's compact KV is cut out of it only when the batch changes or the sequence is used alone."""
        from medgemma_xray.engine_bundle.masks import attention_masks

        batch = self._batch
        if batch is None or batch.members != sequences or any(s.batch is not batch for s in sequences):
            self.flush_batch()
            batch = self._pad_batch(sequences)
        positions = batch.pasts[:, None].copy()
        key_positions = np.concatenate([batch.key_positions, positions], axis=1)
        full, sliding = attention_masks(positions, key_positions, sliding_window)
        feeds = {"inputs_embeds": inputs_embeds.astype(np.float32), "position_ids": positions}
        feeds["full_mask"], feeds["sliding_mask"] = full, sliding
        feeds.update(zip(self.kv_input_names, batch.kv, strict=True))
        logits, *presents = self.sessions["decoder"].run(None, feeds)
        batch.kv, batch.key_positions, batch.pasts = presents, key_positions, batch.pasts + 1
        self._batch = batch
        return logits[:, -1].astype(np.float32)

    def _pad_batch(self, sequences: list[OnnxSequence]) -> _DecodeBatch:
        pasts = np.asarray([sequence.past_length for sequence in sequences], dtype=np.int64)
        longest = int(pasts.max())
        key_positions = np.full((len(sequences), longest + 1), -1, dtype=np.int64)
        kv = []
        for row, past in enumerate(pasts):
            key_positions[row, 1 : 1 + past] = np.arange(past)
        for index in range(len(self.kv_input_names)):
            padded = np.empty((len(sequences), self.kv_heads, longest + 1, self.head_dim), dtype=np.float32)
            for row, sequence in enumerate(sequences):
                keep = int(pasts[row]) + 1
                if sequence.kv is None:
                    padded[row, :, :keep] = 0.0
                else:
                    padded[row, :, :keep] = sequence.kv[index][0]
                padded[row, :, keep:] = 0.0  # masked, but must be finite: 0 x NaN would still be NaN
            kv.append(padded)
        batch = _DecodeBatch(list(sequences), kv, key_positions, pasts)
        for sequence in sequences:
            sequence._kv, sequence.batch = None, batch
        return batch

    def flush_batch(self) -> None:
        """Give every member of the running decode batch its own compact KV back (the batch ends)."""
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
        self.sessions.clear()


class _DecodeBatch:
    """The running decode batch: its members in row order, their padded KV (the last run's presents), every key's
    position per row (-1: dead slot or padding), and each row's past length."""

    def __init__(self, members: list, kv: list, key_positions: np.ndarray, pasts: np.ndarray) -> None:
        self.members, self.kv, self.key_positions, self.pasts = members, kv, key_positions, pasts


class OnnxSequence:
    """One conversation's KV cache (host arrays); slot 0 of every cache is the dead slot. While the sequence is in
    the executor's running decode batch, its KV lives there and is cut out on first use alone."""

    def __init__(self, executor: OnnxRuntimeExecutor, slot: int) -> None:
        self.executor = executor
        self.slot: int | None = slot  # None once closed
        self._kv: list[np.ndarray] | None = None  # (batch, kv_heads, 1 + past_length, head_dim) per layer and kind
        self.batch: _DecodeBatch | None = None

    @property
    def kv(self) -> list[np.ndarray] | None:
        if self.batch is not None:
            batch = self.batch
            self._take_from_batch(batch.members.index(self))
        return self._kv

    @kv.setter
    def kv(self, value) -> None:
        self.batch, self._kv = None, value

    def _take_from_batch(self, row: int) -> None:
        batch, self.batch = cast(_DecodeBatch, self.batch), None  # called only while it is in a batch
        valid = np.concatenate([[0], np.flatnonzero(batch.key_positions[row, 1:] >= 0) + 1])
        self._kv = [np.ascontiguousarray(value[row : row + 1, :, valid]) for value in batch.kv]

    @property
    def past_length(self) -> int:
        """Tokens in the cache, the dead slot not counted."""
        if self.batch is not None:
            return int(self.batch.pasts[self.batch.members.index(self)])
        return 0 if self._kv is None else self._kv[0].shape[2] - 1

    def past_feeds(self, batch: int) -> dict[str, np.ndarray]:
        """The past-KV inputs the next run will feed (the calibration recorder keeps them)."""
        e = self.executor
        if self.kv is None:
            empty = np.zeros((batch, e.kv_heads, 1, e.head_dim), dtype=np.float32)
            return dict.fromkeys(e.kv_input_names, empty)
        return dict(zip(e.kv_input_names, self.kv, strict=True))

    def run(self, inputs_embeds, position_ids, full_mask, sliding_mask) -> np.ndarray:
        """Append the new tokens to the cache; return float32 logits of the last token, shape (batch, vocab)."""
        if self.slot is None:
            raise RuntimeError("this sequence was closed")
        executor = self.executor
        new, total = inputs_embeds.shape[1], full_mask.shape[-1]
        if self.past_length + 1 + new != total:
            raise ValueError(f"mask covers {total} keys, but the cache holds 1 + {self.past_length} plus {new} new")
        if total > executor.max_sequence + 1:
            raise ValueError(f"conversation of {total - 1} tokens exceeds the bundle's maximum {executor.max_sequence}")
        feeds = {
            "inputs_embeds": inputs_embeds.astype(np.float32),
            "position_ids": position_ids.astype(np.int64),
            "full_mask": full_mask,
            "sliding_mask": sliding_mask,
            **self.past_feeds(inputs_embeds.shape[0]),
        }
        # A prompt's run peaks with its length (attention over every key): its arena chunks go back after it.
        run_options = executor.shrink_after if new > 1 else None
        logits, *presents = executor.sessions["decoder"].run(None, feeds, run_options)
        self.kv = presents
        return logits[:, -1].astype(np.float32)

    def truncate(self, past_length: int) -> None:
        """Keep the first past_length tokens (and the dead slot); the next run continues from there."""
        if not 0 <= past_length <= self.past_length:
            raise ValueError(f"cannot truncate a cache of {self.past_length} tokens to {past_length}")
        if self.kv is not None and past_length < self.past_length:
            self.kv = [np.ascontiguousarray(value[:, :, : past_length + 1]) for value in self.kv]

    def close(self) -> None:
        """Give the slot back. Idempotent."""
        self.kv = None  # also leaves the decode batch (its row is skipped when the batch is flushed)
        if self.slot is not None:
            slot, self.slot = self.slot, None
            self.executor.slots.release(slot)
