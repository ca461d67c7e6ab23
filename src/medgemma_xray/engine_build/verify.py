"""The accuracy gate: a bundle against the PyTorch reference on held-out films, through the backend contract.

Figures (medgemma_xray.engine_build.comparison.Comparator): cosine of the image embeddings, greedy token agreement over the
first N tokens, the identical prefix, the log-probability difference of each token on that prefix, and the KL
divergence of the first answer token's distribution (reference || bundle). The long conversation adds the whole
answer position by position: PyTorch's greedy answer is fed to both backends (teacher forcing), and the top-1
agreement and KL divergence are taken at every position, so that later tokens count as much as the first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from medgemma_xray.engine_build.calibration import CALIBRATION_QUESTIONS
from medgemma_xray.engine_build.comparison import Comparator, compare_distributions
from medgemma_xray.engine_bundle.gate import DEFAULT_THRESHOLDS, LONG_CONVERSATION_TOKENS, gate_failures
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest


@dataclass(frozen=True)
class Thresholds:
    """The gate's thresholds (defaults: medgemma_xray.engine_bundle.gate.DEFAULT_THRESHOLDS)."""

    min_cosine: float = DEFAULT_THRESHOLDS["min_cosine"]
    min_token_agreement: float = DEFAULT_THRESHOLDS["min_token_agreement"]
    min_long_token_agreement: float = DEFAULT_THRESHOLDS["min_long_token_agreement"]
    min_long_top1_agreement: float = DEFAULT_THRESHOLDS["min_long_top1_agreement"]
    max_logprob_delta: float = DEFAULT_THRESHOLDS["max_logprob_delta"]
    max_kl: float = DEFAULT_THRESHOLDS["max_kl"]
    max_long_kl: float = DEFAULT_THRESHOLDS["max_long_kl"]


class AccuracyError(RuntimeError):
    """The bundle's accuracy against PyTorch is worse than the stated thresholds."""


def verification_requests(images: list, tokens: int) -> list[GenerationRequest]:
    """One teaching-round question per held-out film (not the calibration questions' order)."""
    return [
        GenerationRequest(
            image,
            (ChatTurn("user", CALIBRATION_QUESTIONS[(index + 1) % len(CALIBRATION_QUESTIONS)]),),
            max_new_tokens=tokens,
        )
        for index, image in enumerate(images)
    ]


_ROUND_ANSWERS = (
    "The lungs are clear without focal consolidation. No pleural effusion or pneumothorax is seen.",
    "The cardiac silhouette is within normal limits. The mediastinum is not widened.",
    "No lines or tubes are present. The osseous structures are intact.",
    "There is no airspace opacity in either lower lobe. The costophrenic angles are sharp.",
    "Findings: clear lungs, normal heart size, no effusion. Impression: no acute cardiopulmonary process.",
)


def long_conversation_request(
    image, min_prompt_tokens: int, tokens: int, count_tokens, max_prompt_tokens: int | None = None
) -> tuple[GenerationRequest, int]:
    """A multi-turn conversation about one film: rounds of a question and a full read of the film, then a last
    question, until its prompt has at least min_prompt_tokens tokens (counted with count_tokens(request) -> ids of
    shape (1, n)) or one more round would pass max_prompt_tokens. Returns it and its prompt length.

    Long prompts are where a low-precision rotary embedding or attention drifts (positions times frequencies lose
    their fraction in fp16), and the short verification questions never reach them."""
    turns: list[ChatTurn] = []
    best: tuple[GenerationRequest, int] | None = None
    index = 0
    while True:
        question = CALIBRATION_QUESTIONS[index % len(CALIBRATION_QUESTIONS)]
        request = GenerationRequest(image, (*turns, ChatTurn("user", question)), max_new_tokens=tokens)
        length = int(count_tokens(request).shape[1])
        if max_prompt_tokens is not None and length > max_prompt_tokens:
            if best is None:
                raise ValueError(f"even one question takes {length} tokens, more than {max_prompt_tokens}")
            return best
        best = request, length
        if length >= min_prompt_tokens:
            return best
        shift = index % len(_ROUND_ANSWERS)
        answer = " ".join(_ROUND_ANSWERS[shift:] + _ROUND_ANSWERS[:shift])  # a full read of the film, every round
        turns += [ChatTurn("user", question), ChatTurn("assistant", answer)]
        index += 1


def long_conversation_tokens(max_sequence: int, tokens: int) -> int:
    """The long case's prompt length: LONG_CONVERSATION_TOKENS, or as long as the bundle can hold with the answer."""
    return min(LONG_CONVERSATION_TOKENS, max_sequence - tokens)


def measure_accuracy(reference_backend, bundle_backend, images: list, tokens: int = 16, max_sequence: int = 0) -> dict:
    """The short questions on every held-out film, then one long multi-turn conversation on the first film
    (max_sequence: the bundle's longest conversation; 0 leaves the long case out, for callers that are not a gate)."""
    backends = {"pytorch": reference_backend, "bundle": bundle_backend}
    runs = Comparator.run(backends, verification_requests(images, tokens))
    figures = Comparator.compare_accuracy(runs["pytorch"], runs["bundle"], tokens)
    if max_sequence:
        request, length = long_conversation_request(
            images[0],
            long_conversation_tokens(max_sequence, tokens),
            tokens,
            bundle_backend.prompt_ids,
            max_prompt_tokens=max_sequence - tokens,
        )
        figures["long_conversation"] = {"prompt_tokens": length, **long_case_figures(backends, request, tokens)}
    return figures


def long_case_figures(backends: dict, request: GenerationRequest, tokens: int) -> dict:
    """The long case, free-running and teacher-forced: greedy agreement, identical prefix, first-token KL, and
    over every position of PyTorch's answer the top-1 agreement and KL (backends: {"pytorch": .., "bundle": ..})."""
    runs = Comparator.run(backends, [request], features=False)
    free = Comparator.compare_accuracy(runs["pytorch"], runs["bundle"], tokens)
    answer = [step.token_id for step in runs["pytorch"].steps[0]]
    forced = compare_distributions(
        backends["pytorch"].answer_logits(request, answer), backends["bundle"].answer_logits(request, answer)
    )
    return {
        "turns": len(request.turns),
        "token_agreement": free["token_agreement_mean"],
        "identical_prefix": free["identical_prefix_min"],
        "first_token_kl": free["first_token_kl_max"],
        "logprob_delta_max": free["logprob_delta_max"],
        **forced,
    }


def check(figures: dict, thresholds: Thresholds) -> list[str]:
    """Human-readable threshold violations; empty when the bundle passes (medgemma_xray.engine_bundle.gate: the runtime applies
    the same rule to the recorded figures at load)."""
    return gate_failures(figures, asdict(thresholds))


def thresholds_from_record(record: dict) -> Thresholds:
    """The Thresholds a manifest recorded (its F1 allowance is the task gate's, kept apart)."""
    names = Thresholds.__dataclass_fields__
    return Thresholds(**{key: value for key, value in record.items() if key in names})


def thresholds_record(thresholds: Thresholds) -> dict:
    return asdict(thresholds)
