"""Polygraphy's Comparator, for backends: run every backend on the same requests, then compare each with a reference.

Backends are compared through the contract only: `generate_steps(request)` (greedy TokenStep(token_id, logprob),
stop token excluded), `next_token_logits(request)` (the first token's whole distribution, for KL) and
`image_features(images)`. So the same harness compares PyTorch with an engine bundle
(build verification), the TensorRT executor with ONNX Runtime (the executor tests), or anything else.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from medgemma_xray.inference_api.types import GenerationRequest, TokenStep


def generate_steps(backend, request: GenerationRequest) -> list[TokenStep]:
    """The one place the harness asks a backend for its tokens: the token-level contract's generate_steps."""
    return list(backend.generate_steps(request))


def kl_divergence(reference_logits: np.ndarray, logits: np.ndarray) -> float:
    """KL(reference || candidate) of two next-token distributions, in nats."""

    def log_softmax(x):
        x = np.asarray(x, dtype=np.float64).ravel()
        x = x - x.max()
        return x - np.log(np.exp(x).sum())

    p_log, q_log = log_softmax(reference_logits), log_softmax(logits)
    return float((np.exp(p_log) * (p_log - q_log)).sum())


@dataclass
class BackendRun:
    """What one backend produced for every request, in request order."""

    name: str
    steps: list[list[TokenStep]] = field(default_factory=list)
    features: list[np.ndarray] = field(default_factory=list)
    first_logits: list[np.ndarray] = field(default_factory=list)  # the first answer token's whole distribution
    seconds: float = 0.0


class Comparator:
    @staticmethod
    def run(
        backends: dict[str, Any], requests: Sequence[GenerationRequest], features: bool = True, logits: bool = True
    ) -> dict[str, BackendRun]:
        """Every backend on every request: its greedy steps; if features, its image embedding of the film; if
        logits, the first answer token's logits (next_token_logits)."""
        runs = {}
        for name, backend in backends.items():
            run = BackendRun(name)
            started = time.perf_counter()
            for request in requests:
                if features:
                    run.features.append(np.asarray(backend.image_features([request.image]), dtype=np.float32))
                run.steps.append(generate_steps(backend, request))
                if logits:
                    run.first_logits.append(np.asarray(backend.next_token_logits(request), dtype=np.float32))
            run.seconds = time.perf_counter() - started
            runs[name] = run
        return runs

    @staticmethod
    def compare_accuracy(reference: BackendRun, candidate: BackendRun, tokens: int) -> dict:
        """Figures of candidate against reference: embedding cosine, token agreement, log-probability deltas."""
        agreements, prefixes, deltas = [], [], []
        for expected, produced in zip(reference.steps, candidate.steps, strict=True):
            length = max(len(expected), len(produced), 1)
            agreements.append(sum(a.token_id == b.token_id for a, b in zip(expected, produced, strict=False)) / length)
            prefix = 0
            while prefix < min(len(expected), len(produced)) and expected[prefix].token_id == produced[prefix].token_id:
                deltas.append(abs(expected[prefix].logprob - produced[prefix].logprob))
                prefix += 1
            prefixes.append(prefix)
        cosines = [cosine(a, b) for a, b in zip(reference.features, candidate.features, strict=True)]
        kls = [kl_divergence(a, b) for a, b in zip(reference.first_logits, candidate.first_logits, strict=True)]
        return {
            "films": len(reference.steps),
            "tokens_compared": tokens,
            "image_embedding_cosine_min": min(cosines) if cosines else None,
            "image_embedding_cosine_mean": float(np.mean(cosines)) if cosines else None,
            "token_agreement_mean": float(np.mean(agreements)),
            "token_agreement_min": float(min(agreements)),
            "identical_prefix_min": int(min(prefixes)),
            "logprob_delta_max": float(max(deltas)) if deltas else None,
            "logprob_delta_mean": float(np.mean(deltas)) if deltas else None,
            "first_token_kl_max": float(max(kls)) if kls else None,
            "first_token_kl_mean": float(np.mean(kls)) if kls else None,
        }

    @staticmethod
    def identical(reference: BackendRun, candidate: BackendRun) -> list[str]:
        """Token-for-token equality; the differences, one line per request, empty when identical."""
        differences = []
        for index, (expected, produced) in enumerate(zip(reference.steps, candidate.steps, strict=True)):
            a, b = [s.token_id for s in expected], [s.token_id for s in produced]
            if a != b:
                first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                differences.append(
                    f"request {index}: {candidate.name} differs from {reference.name} at token {first} "
                    f"({len(b)} vs {len(a)} tokens)"
                )
        return differences


def compare_distributions(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """Position by position, two backends' logits over the same fed answer (InferenceBackend.answer_logits, shape
    (positions, vocab)): how often their top-1 tokens agree, and the KL divergence (reference || candidate) at
    every position, its mean, its largest and where that is."""
    if reference.shape != candidate.shape:
        raise ValueError(f"logits of shapes {reference.shape} and {candidate.shape} cannot be compared")
    kls = [kl_divergence(a, b) for a, b in zip(reference, candidate, strict=True)]
    top1 = reference.argmax(axis=-1) == candidate.argmax(axis=-1)
    worst = int(np.argmax(kls))
    return {
        "answer_positions": len(kls),
        "top1_agreement": float(top1.mean()),
        "first_top1_disagreement": int(np.argmin(top1)) if not top1.all() else None,
        "kl_mean": float(np.mean(kls)),
        "kl_max": float(kls[worst]),
        "kl_max_position": worst,
    }


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a).ravel().astype(np.float64), np.asarray(b).ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
