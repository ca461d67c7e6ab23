"""The accuracy gate: a bundle against the PyTorch reference on held-out films, through the backend contract.

Figures (engine_build.comparison.Comparator): cosine of the image embeddings, greedy token agreement over the
first N tokens, the identical prefix, the log-probability difference of each token on that prefix, and the KL
divergence of the first answer token's distribution (reference || bundle).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine_build.calibration import CALIBRATION_QUESTIONS
from engine_build.comparison import Comparator
from inference_api.types import ChatTurn, GenerationRequest


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float = 0.99
    min_token_agreement: float = 0.9
    max_logprob_delta: float = 0.1  # nats, on the tokens both agree on
    max_kl: float = 0.05  # nats, the first answer token's distribution


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


def measure_accuracy(reference_backend, bundle_backend, images: list, tokens: int = 16) -> dict:
    requests = verification_requests(images, tokens)
    runs = Comparator.run({"pytorch": reference_backend, "bundle": bundle_backend}, requests)
    return Comparator.compare_accuracy(runs["pytorch"], runs["bundle"], tokens)


def check(figures: dict, thresholds: Thresholds) -> list[str]:
    """Human-readable threshold violations; empty when the bundle passes."""
    failures = []
    if figures["image_embedding_cosine_min"] < thresholds.min_cosine:
        failures.append(f"image embedding cosine {figures['image_embedding_cosine_min']:.5f} < {thresholds.min_cosine}")
    if figures["token_agreement_mean"] < thresholds.min_token_agreement:
        failures.append(f"token agreement {figures['token_agreement_mean']:.3f} < {thresholds.min_token_agreement}")
    delta = figures.get("logprob_delta_max")
    if delta is not None and delta > thresholds.max_logprob_delta:
        failures.append(f"token log-probability delta {delta:.4f} > {thresholds.max_logprob_delta} nats")
    kl = figures.get("first_token_kl_max")
    if kl is not None and kl > thresholds.max_kl:
        failures.append(f"first-token KL {kl:.5f} > {thresholds.max_kl}")
    return failures


def thresholds_record(thresholds: Thresholds) -> dict:
    return asdict(thresholds)
