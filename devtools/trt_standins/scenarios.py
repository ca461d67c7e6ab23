"""The conversations and executor checks the TensorRT executor must pass against ONNX Runtime: shared by the CI
test (host-memory CUDA stand-in) and benchmarks/h200_tensorrt_executor.py (real CUDA memory and streams)."""

from __future__ import annotations

import numpy as np

from medgemma_xray.engine_bundle.masks import attention_masks
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest


def two_turn_requests(reference_backend, film, tokens: int = 16) -> list[GenerationRequest]:
    """A question, then a follow-up whose history holds the reference backend's own first answer."""
    from medgemma_xray.engine_build.comparison import generate_steps

    first = GenerationRequest(film, (ChatTurn("user", "What are the main findings?"),), max_new_tokens=tokens)
    answer = reference_backend.text.decode([step.token_id for step in generate_steps(reference_backend, first)])
    second = GenerationRequest(
        film,
        (
            *first.turns,
            ChatTurn("assistant", answer or "No acute findings."),
            ChatTurn("user", "Is the heart enlarged?"),
        ),
        max_new_tokens=tokens,
    )
    return [first, second]


def past_the_window_request(film, tokens: int = 24) -> GenerationRequest:
    """A conversation longer than the demo's 512-token sliding window."""
    history = (
        ChatTurn("user", "Describe the lungs, pleura, heart, mediastinum, bones and every device you can see. " * 6),
        ChatTurn("assistant", "The lungs are clear. The heart size is normal. No pleural effusion. " * 8),
        ChatTurn("user", "Now compare both costophrenic angles and comment on the hemidiaphragms."),
    )
    return GenerationRequest(film, history, max_new_tokens=tokens)


def feed_tokens(executor, sequence, token_ids: list[int], start: int, sliding_window: int, key_positions: list[int]):
    """Feed token_ids at positions start.. into sequence (text only); key_positions grows with them. Returns logits."""
    ids = np.asarray([token_ids], dtype=np.int64)
    positions = np.arange(start, start + len(token_ids), dtype=np.int64)[None]
    key_positions.extend(range(start, start + len(token_ids)))
    keys = np.asarray([key_positions], dtype=np.int64)
    full, sliding = attention_masks(positions, keys, sliding_window)
    return sequence.run(executor.embed(ids), positions, full, sliding)


def truncate_then_continue(executor, sliding_window: int, prompt: list[int], tail: list[int], keep: int) -> float:
    """Max |logit difference| between (prompt + tail, truncated to keep, + tail) and a fresh sequence over the same
    tokens: zero when truncate keeps exactly the first `keep` tokens' KV."""
    sequence = executor.new_sequence(timeout_s=0)
    try:
        keys = [-1]
        feed_tokens(executor, sequence, prompt + tail, 0, sliding_window, keys)
        sequence.truncate(keep)
        assert sequence.past_length == keep, (sequence.past_length, keep)
        keys = keys[: keep + 1]
        resumed = feed_tokens(executor, sequence, (prompt + tail)[keep:], keep, sliding_window, keys)
    finally:
        sequence.close()
    fresh_sequence = executor.new_sequence(timeout_s=0)
    try:
        fresh = feed_tokens(executor, fresh_sequence, prompt + tail, 0, sliding_window, [-1])
    finally:
        fresh_sequence.close()
    return float(np.abs(resumed - fresh).max())
