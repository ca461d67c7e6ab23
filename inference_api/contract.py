"""The contract both backends implement, and its request/result types (Polygraphy's runner shape).

Public methods validate and keep the bookkeeping; each backend implements only the `_*_impl` methods.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = "You are an expert radiologist."
DEFAULT_MAX_NEW_TOKENS = 300  # what Google's MedGemma examples use for image questions
MAX_MAX_NEW_TOKENS = 2048


@dataclass(frozen=True)
class ChatTurn:
    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True)
class GenerationRequest:
    """One model call: the film (already padded to square, RGB) and the conversation so far, ending with the user."""

    image: Any  # PIL.Image.Image; kept untyped so this module never imports Pillow
    turns: tuple[ChatTurn, ...]
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    system_prompt: str = SYSTEM_PROMPT

    def validate(self) -> None:
        if not self.turns:
            raise ValueError("a request needs at least one user turn")
        for index, turn in enumerate(self.turns):
            expected = "user" if index % 2 == 0 else "assistant"
            if turn.role != expected:
                raise ValueError(f"turn {index} is {turn.role!r}; turns must alternate user/assistant from a user turn")
        if self.turns[-1].role != "user":
            raise ValueError("the last turn must be the user's question")
        if not self.turns[-1].text.strip():
            raise ValueError("the question is empty")
        if not 1 <= self.max_new_tokens <= MAX_MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be in 1..{MAX_MAX_NEW_TOKENS}, got {self.max_new_tokens}")


@dataclass(frozen=True)
class BackendInfo:
    mode: Literal["pytorch", "tensorrt"]
    precision: str  # "bf16", "fp32", "int8", ...
    device: str  # "cpu", "NVIDIA H200", ...
    executor: str  # "transformers", "tensorrt", "onnxruntime-cpu"
    model_id: str
    is_demo: bool
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def mode_label(self) -> str:
        return {"pytorch": "PyTorch", "tensorrt": "TensorRT"}[self.mode]


@dataclass
class GenerationStats:
    """Filled in by a backend while it streams: what the metrics and the benchmark report."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    first_token_s: float | None = None  # seconds from the call to the first generated token


class BackendClosedError(RuntimeError):
    """The backend was closed (for example after a hot switch) and can no longer serve."""


class InferenceBackend(abc.ABC):
    """A loaded model that answers questions about a film. Thread-safe for concurrent generate calls."""

    def __init__(self) -> None:
        self._closed = False
        self._close_lock = threading.Lock()

    # --- public contract -------------------------------------------------------------------------------
    def stream_generate(self, request: GenerationRequest, stats: GenerationStats | None = None) -> Iterator[str]:
        """Yield the answer as text fragments, in order; their concatenation is the whole answer.

        Closing the iterator early stops generation. `stats`, if given, is filled in as tokens arrive.
        """
        self.check_health()
        request.validate()
        return self._stream_generate_impl(request, stats if stats is not None else GenerationStats())

    def generate(self, request: GenerationRequest) -> str:
        return "".join(self.stream_generate(request))

    def image_features(self, images: Sequence[Any]):
        """Projected image embeddings, float32 numpy of shape (len(images), 256, text hidden size)."""
        self.check_health()
        if not images:
            raise ValueError("image_features needs at least one image")
        return self._image_features_impl(list(images))

    def info(self) -> BackendInfo:
        return self._info_impl()

    def warm_up(self) -> float:
        """Run one tiny request so the first user does not pay for lazy initialisation. Returns seconds taken."""
        self.check_health()
        started = time.perf_counter()
        self._warm_up_impl()
        elapsed = time.perf_counter() - started
        logger.info("%s backend warmed up in %.2f s", self.info().mode_label, elapsed)
        return elapsed

    def check_health(self) -> None:
        if self._closed:
            raise BackendClosedError(f"{type(self).__name__} is closed")

    def close(self) -> None:
        """Release the model. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._close_impl()
        logger.info("%s backend closed", type(self).__name__)

    @property
    def closed(self) -> bool:
        return self._closed

    # --- what each backend implements ---------------------------------------------------------------------
    @abc.abstractmethod
    def _stream_generate_impl(self, request: GenerationRequest, stats: GenerationStats) -> Iterator[str]: ...

    @abc.abstractmethod
    def _image_features_impl(self, images: list[Any]): ...

    @abc.abstractmethod
    def _info_impl(self) -> BackendInfo: ...

    @abc.abstractmethod
    def _warm_up_impl(self) -> None: ...

    @abc.abstractmethod
    def _close_impl(self) -> None: ...


def chat_messages(request: GenerationRequest, image_placeholder: Any = None) -> list[dict]:
    """Hugging Face chat messages for the request: system prompt, then turns, the image in the first user turn."""
    messages: list[dict] = [{"role": "system", "content": [{"type": "text", "text": request.system_prompt}]}]
    for index, turn in enumerate(request.turns):
        content: list[dict] = []
        if index == 0:
            content.append(
                {"type": "image", "image": image_placeholder if image_placeholder is not None else request.image}
            )
        content.append({"type": "text", "text": turn.text})
        messages.append({"role": turn.role, "content": content})
    return messages


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas without splitting multi-byte characters.

    Same rule as transformers' TextStreamer: hold text back while it ends in an incomplete character.
    """

    def __init__(self, decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        delta, self._emitted = text[self._emitted :], len(text)
        return delta

    def flush(self) -> str:
        text = self._decode(self._ids)
        delta, self._emitted = text[self._emitted :], len(text)
        return delta
