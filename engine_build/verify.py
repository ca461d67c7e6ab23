"""Accuracy of a bundle against the PyTorch reference on held-out films (Polygraphy's Comparator shape).

Figures: cosine of the image embeddings, greedy token agreement over the first N tokens, and the KL divergence
of the first answer token's distribution (reference || bundle).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from engine_build.calibration import CALIBRATION_QUESTIONS
from inference_api.types import ChatTurn, GenerationRequest


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float = 0.99
    min_token_agreement: float = 0.9
    max_kl: float = 0.05


class AccuracyError(RuntimeError):
    """The bundle's accuracy against PyTorch is worse than the stated thresholds."""


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def kl_divergence(reference_logits: np.ndarray, logits: np.ndarray) -> float:
    def log_softmax(x):
        x = x.astype(np.float64) - x.max()
        return x - np.log(np.exp(x).sum())

    p_log, q_log = log_softmax(reference_logits), log_softmax(logits)
    return float((np.exp(p_log) * (p_log - q_log)).sum())


def compare(reference, candidate, images: list, tokens: int = 16) -> dict:
    """Both backends through the same contract, on the same requests (Polygraphy's Comparator shape)."""
    cosines, agreements, prefixes, kls = [], [], [], []
    for index, image in enumerate(images):
        cosines.append(cosine(reference.image_features([image]), candidate.image_features([image])))
        question = CALIBRATION_QUESTIONS[(index + 1) % len(CALIBRATION_QUESTIONS)]
        request = GenerationRequest(image, (ChatTurn("user", question),), max_new_tokens=tokens)
        expected = [step.token_id for step in reference.generate_steps(request)]
        produced = [step.token_id for step in candidate.generate_steps(request)]
        length = max(len(expected), len(produced), 1)
        agreements.append(sum(1 for a, b in zip(expected, produced, strict=False) if a == b) / length)
        prefixes.append(
            next(
                (i for i, (a, b) in enumerate(zip(expected, produced, strict=False)) if a != b),
                min(len(expected), len(produced)),
            )
        )
        kls.append(kl_divergence(reference.next_token_logits(request), candidate.next_token_logits(request)))
    return {
        "films": len(images),
        "tokens_compared": tokens,
        "image_embedding_cosine_min": min(cosines),
        "image_embedding_cosine_mean": float(np.mean(cosines)),
        "token_agreement_mean": float(np.mean(agreements)),
        "token_agreement_min": min(agreements),
        "identical_prefix_min": int(min(prefixes)),
        "first_token_kl_mean": float(np.mean(kls)),
        "first_token_kl_max": float(max(kls)),
    }


def check(figures: dict, thresholds: Thresholds) -> list[str]:
    """Human-readable threshold violations; empty when the bundle passes."""
    failures = []
    if figures["image_embedding_cosine_min"] < thresholds.min_cosine:
        failures.append(f"image embedding cosine {figures['image_embedding_cosine_min']:.5f} < {thresholds.min_cosine}")
    if figures["token_agreement_mean"] < thresholds.min_token_agreement:
        failures.append(f"token agreement {figures['token_agreement_mean']:.3f} < {thresholds.min_token_agreement}")
    if figures["first_token_kl_max"] is not None and figures["first_token_kl_max"] > thresholds.max_kl:
        failures.append(f"first-token KL {figures['first_token_kl_max']:.5f} > {thresholds.max_kl}")
    return failures


def thresholds_record(thresholds: Thresholds) -> dict:
    return asdict(thresholds)
