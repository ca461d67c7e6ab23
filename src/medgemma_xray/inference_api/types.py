"""Requests and results of the backend contract: plain dataclasses, no torch and no numpy."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from medgemma_xray.engine_bundle.checkpoint_profile import CAPABILITIES as CAPABILITIES
from medgemma_xray.engine_bundle.checkpoint_profile import LOCALISATION as LOCALISATION
from medgemma_xray.engine_bundle.checkpoint_profile import LONGITUDINAL as LONGITUDINAL
from medgemma_xray.engine_bundle.gate import UNVERIFIED_NOTICE
from medgemma_xray.inference_api.errors import RequestError

SYSTEM_PROMPT = "You are an expert radiologist."
DEFAULT_MAX_NEW_TOKENS = 300  # what Google's MedGemma examples use for image questions
MAX_MAX_NEW_TOKENS = 2048
FinishReason = Literal["stop", "length", "cancelled"]


class Mode(StrEnum):
    """Which backend serves: the one spelling used everywhere (settings, status, scripts, metrics)."""

    PYTORCH = "pytorch"
    TRT = "trt"

    @property
    def label(self) -> str:
        """The mode in words before its backend is loaded (a failed load or switch names it so): "engine bundle",
        since which executor runs a bundle (TensorRT or ONNX Runtime) is known only once it is open."""
        return {"pytorch": "PyTorch", "trt": "engine bundle"}[self.value]

    @classmethod
    def parse(cls, value: str) -> Mode:
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            valid = ", ".join(mode.value for mode in cls)
            raise ValueError(f"unknown mode {value!r}; valid modes: {valid}") from None


@dataclass(frozen=True)
class ChatTurn:
    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True)
class GenerationRequest:
    """One answer: the film (padded to square, RGB) and the conversation so far, ending with the user's question.

    conversation_id: a case's own id. A backend may keep that conversation's KV cache between turns and then
    prefills only the new tokens: a follow-up whose history is the one that conversation answered continues from
    the ids generated for its answers (the text can re-tokenise to other ids), so its answer is the one a fresh
    conversation given that token history gives. image_key identifies the film (a content hash); the cache is
    reused only for the same film. Left out, the contract computes one.

    prior_image: an earlier film of the same patient, for "what changed?" (MedGemma 1.5's longitudinal
    comparison). The user turn that carries the film then holds the prior first, then the current film, then the
    text: the order of Google-Health/medgemma's cxr_longitudinal_comparison notebook ([prior, current, text]).
    prior_image_key is its content hash, as image_key is the current film's; left out, the contract computes it.
    """

    image: Any  # PIL.Image.Image; untyped so this module never imports Pillow
    turns: tuple[ChatTurn, ...]
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    system_prompt: str = SYSTEM_PROMPT
    conversation_id: str | None = None
    image_key: str | None = None
    prior_image: Any = None  # PIL.Image.Image of the earlier film, or None (one film)
    prior_image_key: str | None = None

    @property
    def films(self) -> tuple[Any, ...]:
        """The films in the order the prompt holds them: the prior (if any), then the current film."""
        return tuple(film for film in (self.prior_image, self.image) if film is not None)

    def validate(self) -> None:
        if not self.turns:
            raise RequestError("a request needs at least one user turn")
        if self.prior_image is not None and self.image is None:
            raise RequestError(
                "a prior film was given without a current film; send the current film too, or leave the prior out"
            )
        if self.prior_image_key is not None and self.prior_image is None:
            raise RequestError("prior_image_key was given without a prior film; send the prior film or leave it out")
        for index, turn in enumerate(self.turns):
            expected = "user" if index % 2 == 0 else "assistant"
            if turn.role != expected:
                raise RequestError(
                    f"turn {index} is {turn.role!r}; turns must alternate user/assistant from a user turn"
                )
        if not self.turns[-1].text.strip():
            raise RequestError("the question is empty; type a question before asking")
        if not 1 <= self.max_new_tokens <= MAX_MAX_NEW_TOKENS:
            raise RequestError(f"max_new_tokens must be in 1..{MAX_MAX_NEW_TOKENS}, got {self.max_new_tokens}")


@dataclass(frozen=True)
class TokenStep:
    """One generated token: its id and the natural-log probability the model gave it (greedy: the largest)."""

    token_id: int
    logprob: float


@dataclass(frozen=True)
class BackendInfo:
    mode: Mode
    precision: str  # "bf16", "fp32", "int8", ...
    device: str  # "cpu", "NVIDIA H200", ...
    executor: str  # "transformers", "transformers-fast", "tensorrt", "onnxruntime-cpu"
    model_id: str
    is_demo: bool
    details: dict[str, Any] = field(default_factory=dict)
    demo_notice: str | None = None  # the demo checkpoint's own words on what it is (shown in the UI's badge)
    executor_note: str = ""  # why an engine bundle runs on this executor, e.g. "no TensorRT plans in this bundle"
    unverified_reason: str = ""  # set only when served by the operator's ALLOW_UNVERIFIED_PLANS=1 override
    # What the checkpoint can do beyond describing a film (CAPABILITIES): "localisation" (boxes in MedGemma 1.5's
    # box_2d format), "longitudinal" (a prior film compared with the current one). Empty: neither.
    capabilities: frozenset[str] = frozenset()
    checkpoint_kind: str = ""  # which checkpoint this is, in words (checkpoint profile), e.g. "MedGemma 1.5 4B"

    @property
    def mode_label(self) -> str:
        """What serves, in words, for every status surface (UI badge, status lines, log): "TensorRT" only where
        TensorRT executes the plans; otherwise the executor that runs, and why."""
        label = "TensorRT" if self.mode is Mode.TRT and self.executor == "tensorrt" else self.mode.label
        if self.mode is Mode.TRT and self.executor != "tensorrt":
            label = f"Engine bundle on {self.executor}, not TensorRT"
            label += f" ({self.executor_note})" if self.executor_note else ""
        if self.unverified_reason:
            label += f" [{UNVERIFIED_NOTICE}]"
        return label

    @property
    def metric_label(self) -> str:
        """The serving backend as a metric label value: "pytorch", or an engine bundle's executor and precision
        (onnxruntime-cpu-int8, tensorrt-fp16), never a bare "trt" that does not say what runs."""
        return "pytorch" if self.mode is Mode.PYTORCH else f"{self.executor}-{self.precision}"

    @property
    def engine_summary(self) -> str:
        """Precision, executor and why, for the `TRT Engine: Loaded (...)` line: INT8, executor onnxruntime-cpu:
        no TensorRT plans in this bundle."""
        text = f"{self.precision.upper()}, executor {self.executor}"
        text += f": {self.executor_note}" if self.executor_note else ""
        return text + (f"; {UNVERIFIED_NOTICE}" if self.unverified_reason else "")


@dataclass
class GenerationStats:
    """Filled in by the contract while an answer streams: what the metrics, the UI and the benchmark report.

    token_logprobs[i] and token_texts[i] belong to the i-th generated token (stop tokens excluded); token_texts[i]
    is the text that token added to the answer ('' while a multi-byte character is incomplete).
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the conversation cache instead of a prefill
    prefix_cached_tokens: int = 0  # prompt tokens whose KV was copied from the shared prefix cache (same film)
    new_tokens: int = 0
    first_token_s: float | None = None  # seconds from the call to the first generated token
    total_s: float | None = None
    finish_reason: FinishReason | None = None
    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # time.perf_counter() when each token was accepted
    replica: str | None = None  # the scale-out replica that answered (None on a single server)

    @property
    def tokens_per_s(self) -> float | None:
        if not self.total_s or not self.new_tokens:
            return None
        return self.new_tokens / self.total_s
