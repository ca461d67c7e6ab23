"""Accuracy of a bundle against the PyTorch reference on held-out films (Polygraphy's Comparator shape).

Figures: cosine of the image embeddings, greedy token agreement over the first N tokens, and the KL divergence
of the first answer token's distribution (reference || bundle).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from engine_build.calibration import CALIBRATION_QUESTIONS
from inference_api.contract import ChatTurn, GenerationRequest


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


def reference_tokens(torch_backend, request: GenerationRequest) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and the first step's raw logits from transformers' generate()."""
    import torch

    inputs = torch_backend.model_inputs(request)
    with torch.inference_mode():
        output = torch_backend.model.generate(
            **inputs, max_new_tokens=request.max_new_tokens, do_sample=False, output_logits=True,
            return_dict_in_generate=True,
        )  # fmt: skip
    tokens = output.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    stops = set(np.atleast_1d(torch_backend.model.generation_config.eos_token_id).tolist())
    while tokens and tokens[-1] in stops:
        tokens.pop()
    return tokens, output.logits[0][0].float().cpu().numpy()


def compare(torch_backend, bundle_backend, images: list, tokens: int = 16) -> dict:
    cosines, agreements, prefixes, kls = [], [], [], []
    for index, image in enumerate(images):
        reference = torch_backend.image_features([image])
        cosines.append(cosine(reference, bundle_backend.image_features([image])))
        question = CALIBRATION_QUESTIONS[(index + 1) % len(CALIBRATION_QUESTIONS)]
        request = GenerationRequest(image, (ChatTurn("user", question),), max_new_tokens=tokens)
        expected, expected_logits = reference_tokens(torch_backend, request)
        produced, first_logits = [], None
        for token, logits in bundle_backend.generate_tokens(request):
            produced.append(token)
            if first_logits is None:
                first_logits = logits
        length = max(len(expected), len(produced), 1)
        matches = sum(1 for a, b in zip(expected, produced, strict=False) if a == b)
        agreements.append(matches / length)
        prefix = next(
            (i for i, (a, b) in enumerate(zip(expected, produced, strict=False)) if a != b),
            min(len(expected), len(produced)),
        )
        prefixes.append(prefix)
        if first_logits is not None:
            kls.append(kl_divergence(expected_logits, first_logits))
    return {
        "films": len(images),
        "tokens_compared": tokens,
        "image_embedding_cosine_min": min(cosines),
        "image_embedding_cosine_mean": float(np.mean(cosines)),
        "token_agreement_mean": float(np.mean(agreements)),
        "token_agreement_min": min(agreements),
        "identical_prefix_min": int(min(prefixes)),
        "first_token_kl_mean": float(np.mean(kls)) if kls else None,
        "first_token_kl_max": float(max(kls)) if kls else None,
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
