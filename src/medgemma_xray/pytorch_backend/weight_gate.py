"""The 8-bit weight mode's accuracy gate: run at start, before readiness; a failure refuses the mode.

Two checks, cheapest first:
1. every quantised matrix reconstructs its bf16 original within weight_only.MAX_RECONSTRUCTION_ERROR (a NaN, zero
   or wrong scale fails here, naming the matrix);
2. teacher-forced decoding: the bf16 step and the 8-bit step read the same prompt (bf16 prefill) and the same
   tokens (bf16's greedy choices); at every step the 8-bit logits must pick bf16's top-1 token (agreement >=
   MIN_TOP1_AGREEMENT) and stay close in distribution (mean KL(bf16 || 8-bit) <= MAX_MEAN_KL).
The same function gives the benchmark's agreement and KL table (more prompts, more tokens, long conversations).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field

from medgemma_xray.pytorch_backend.weight_only import MAX_RECONSTRUCTION_ERROR, reconstruction_error

logger = logging.getLogger(__name__)

MIN_TOP1_AGREEMENT = 0.98
MAX_MEAN_KL = 0.05
GATE_TOKENS = 16  # per prompt at start: enough to see a broken scale, cheap on CPU and GPU
REMEDY = "Set FAST_PATH_WEIGHTS=bf16 (the default), or check the checkpoint's weights for outliers"


class WeightModeRefused(RuntimeError):
    """The 8-bit weight mode failed its accuracy check; the message names what failed and the remedy."""


@dataclass
class AgreementRecord:
    weights: str
    prompts: int = 0
    tokens: int = 0
    top1_agreement: float = 1.0
    mean_kl: float = 0.0
    max_kl: float = 0.0
    per_prompt: list = field(default_factory=list)
    worst_reconstruction: tuple[str, float] | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def check_reconstruction(step) -> tuple[str, float]:
    """Raise WeightModeRefused naming the first matrix whose 8-bit form is not its bf16 original; else return the
    worst (name, relative error)."""
    limit = MAX_RECONSTRUCTION_ERROR[step.weights]
    worst = ("", 0.0)
    for name, (weight, quantized) in step.quantized().items():
        error = reconstruction_error(weight, quantized)
        if not error <= limit:  # NaN fails too
            raise WeightModeRefused(
                f"FAST_PATH_WEIGHTS={step.weights}: matrix {name} does not reconstruct its bf16 weights (relative "
                f"error {error:.3g}, limit {limit:g}): a scale is wrong. {REMEDY}"
            )
        worst = max(worst, (name, error), key=lambda item: item[1])
    return worst


def teacher_forced_agreement(backend, reference, candidate, requests, tokens: int) -> AgreementRecord:
    """reference, candidate: FusedDecodeStep-like objects with .logits(tokens, positions, rows). Both decode from
    the same bf16 prefill of each request, fed the reference's greedy tokens."""
    return teacher_forced_agreements(backend, reference, [candidate], requests, tokens)[0]


def teacher_forced_agreements(backend, reference, candidates, requests, tokens: int) -> list[AgreementRecord]:
    """teacher_forced_agreement for several candidates against one reference run per request (the benchmark
    compares int8 and fp8 with bf16: one bf16 pass instead of two)."""
    torch = backend._torch
    records = [AgreementRecord(weights=candidate.weights) for candidate in candidates]
    agree = [0] * len(candidates)
    total = [0] * len(candidates)
    kls: list[list[float]] = [[] for _ in candidates]
    for request in requests:
        prompt = backend._encode_impl(request)
        backend._prepare_images_impl([prompt])
        kv = backend._allocate_impl()
        try:
            backend._ensure_pages(kv, len(prompt.ids) + tokens)  # the teacher-forced steps write past the prompt
            backend._flush_tables()
            runs = []
            fed: list[int] = []
            for index, step in enumerate((reference, *candidates)):
                with torch.inference_mode():
                    first = backend._run_prompt(kv, prompt, 0, len(prompt.ids))
                    token = int(first.float().argmax(-1)[0])
                    rows = []
                    for offset in range(tokens):
                        if index > 0:
                            token = fed[offset]
                        else:
                            fed.append(token)
                        position = torch.tensor([len(prompt.ids) + offset], device=backend.device)
                        logits = step.logits(
                            torch.tensor([token], device=backend.device),
                            position,
                            torch.tensor([kv.row], device=backend.device),
                        )
                        rows.append(logits[0])
                        if index == 0:
                            token = int(logits[0].argmax())
                runs.append(torch.stack(rows))
        finally:
            backend._free_impl(kv)
        ref_logp = torch.log_softmax(runs[0], dim=-1)
        for which, run in enumerate(runs[1:]):
            cand_logp = torch.log_softmax(run, dim=-1)
            kl = (ref_logp.exp() * (ref_logp - cand_logp)).sum(-1)
            same = (runs[0].argmax(-1) == run.argmax(-1)).float()
            agree[which] += int(same.sum())
            total[which] += len(same)
            kls[which].extend(kl.tolist())
            records[which].per_prompt.append(
                {"prompt_tokens": len(prompt.ids), "top1_agreement": float(same.mean()), "mean_kl": float(kl.mean())}
            )
    for which, record in enumerate(records):
        record.prompts, record.tokens = len(requests), total[which]
        record.top1_agreement = agree[which] / total[which] if total[which] else 1.0
        record.mean_kl = sum(kls[which]) / len(kls[which]) if kls[which] else 0.0
        record.max_kl = max(kls[which], default=0.0)
    return records


def gate_weight_mode(backend, reference, candidate, requests, tokens: int = GATE_TOKENS) -> AgreementRecord:
    """Both checks; raises WeightModeRefused with the figures when either fails. Returns the passing record."""
    started = time.perf_counter()
    worst = check_reconstruction(candidate)
    record = teacher_forced_agreement(backend, reference, candidate, requests, tokens)
    record.worst_reconstruction = worst
    record.seconds = round(time.perf_counter() - started, 2)
    failures = []
    if not record.top1_agreement >= MIN_TOP1_AGREEMENT:
        failures.append(f"top-1 agreement with bf16 {record.top1_agreement:.3f} < {MIN_TOP1_AGREEMENT}")
    if not (math.isfinite(record.mean_kl) and record.mean_kl <= MAX_MEAN_KL):
        failures.append(f"mean KL(bf16 || {candidate.weights}) {record.mean_kl:.4g} > {MAX_MEAN_KL}")
    if failures:
        raise WeightModeRefused(
            f"FAST_PATH_WEIGHTS={candidate.weights} refused at start: {'; '.join(failures)} over {record.prompts} "
            f"prompts x {tokens} tokens. {REMEDY}"
        )
    logger.info(
        "%s weights passed the gate: top-1 agreement %.3f, mean KL %.2g over %d tokens (%.1f s)",
        candidate.weights,
        record.top1_agreement,
        record.mean_kl,
        record.tokens,
        record.seconds,
    )
    return record


def gate_requests():
    """Two questions about a smooth synthetic film: the start gate's prompts (no phantom package below serving)."""
    import numpy as np
    from PIL import Image

    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest

    ramp = np.linspace(0, 255, 896, dtype=np.float32)
    film = (0.5 * ramp[:, None] + 0.5 * ramp[None, :]).astype(np.uint8)
    image = Image.fromarray(film).convert("RGB")
    questions = ("What are the main findings on this chest X-ray?", "Is there a pleural effusion?")
    return [GenerationRequest(image, (ChatTurn("user", q),), max_new_tokens=GATE_TOKENS) for q in questions]


def start_fused_step(backend):
    """FastTorchInference's warm-up hook: gate an 8-bit mode (raises WeightModeRefused), then compile the fused step
    when the backend compiles. Returns the step function the backend decodes with."""
    from medgemma_xray.pytorch_backend.fused_step import FusedDecodeStep

    fused = backend.fused
    if fused.weights != "bf16":
        reference = FusedDecodeStep(backend.decoder, "bf16")
        record = gate_weight_mode(backend, reference, fused, gate_requests())
        backend.startup["weight_gate"] = {
            "top1_agreement": round(record.top1_agreement, 4),
            "mean_kl": record.mean_kl,
            "tokens": record.tokens,
            "worst_reconstruction": record.worst_reconstruction,
            "seconds": record.seconds,
        }
    if backend.use_compile:
        fused.compile()
    return fused.decode
