"""What TRTInference asks of an executor and of the sequences it lends, written down once.

Two executors run a bundle: ONNX Runtime on the CPU (`onnx_executor`) and TensorRT on an NVIDIA GPU
(`tensorrt_executor`). TRTInference holds either through `Executor`, so mypy checks both against it where they
are opened, and `tests/trt_inference/test_tensorrt_executor.py` checks real instances of both. Batched decoding is
the one capability only one of them has (TensorRT's per-slot device buffers have no batch axis): it is its own
protocol, `BatchDecoder`, asked with isinstance instead of probing for an attribute.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class ExecutorSequence(Protocol):
    """One conversation's KV cache on a decoder slot lent by its executor; close() gives the slot back."""

    @property
    def past_length(self) -> int:
        """Tokens in the cache (the dead slot not counted)."""
        ...

    def run(
        self, inputs_embeds: np.ndarray, position_ids: np.ndarray, full_mask: np.ndarray, sliding_mask: np.ndarray
    ) -> np.ndarray:
        """Append the new tokens to the cache; float32 logits of the last token, shape (batch, vocab)."""
        ...

    def truncate(self, past_length: int) -> None:
        """Keep the first past_length tokens; the next run continues from there (a follow-up that edits history)."""
        ...

    def close(self) -> None:
        """Give the slot back. Idempotent."""
        ...


@runtime_checkable
class Executor(Protocol):
    """Runs a bundle's graphs: vision, token embedding, and decoder sequences on a fixed number of slots."""

    @property
    def name(self) -> str:
        """What every status surface names as the executor ("tensorrt", "onnxruntime-cpu")."""
        ...

    def vision(self, pixel_values: np.ndarray) -> np.ndarray:
        """Image embeddings for a batch of preprocessed films (split by the bundle's max_batch)."""
        ...

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        """Token embeddings, (batch, tokens, hidden)."""
        ...

    def new_sequence(self, timeout_s: float | None = ...) -> ExecutorSequence:
        """A sequence on a free slot; raises medgemma_xray.inference_api.errors.NoFreeSlotError if none frees up in time."""
        ...

    def close(self) -> None:
        """Release the sessions or engines and their memory."""
        ...


@runtime_checkable
class BatchDecoder(Protocol):
    """An executor that decodes one token for several sequences in one call (one read of the weights for all)."""

    def decode_batch(self, sequences: list, inputs_embeds: np.ndarray, sliding_window: int) -> np.ndarray:
        """One new token for each sequence; float32 logits, (batch, vocab)."""
        ...
