"""Task accuracy on held-out labelled phantoms: ask each film the finding questions through any backend, score
per-finding F1 and macro-F1, and the calibration (ECE) of the answers' confidence.

Works with any InferenceBackend (PyTorch, an engine bundle under TensorRT or ONNX Runtime): it only calls
`stream_generate(request, stats)`. Confidence is exp(mean token log-probability) of the answer, from
stats.token_logprobs; a backend that does not fill them gets no ECE (None), the F1 figures stand regardless.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels

logger = logging.getLogger(__name__)

# Held-out phantoms use seeds below this; the demo model's training films use seeds from TRAIN_SEED_BASE up.
HELD_OUT_SEED_LIMIT = 1_000_000
TRAIN_SEED_BASE = 1_000_000
DEFAULT_MAX_NEW_TOKENS = 40  # a yes/no answer with its detail; the verdict is the first word
ECE_BINS = 10


@dataclass(frozen=True)
class HeldOutPhantom:
    name: str
    image: object  # the PIL image the server hands the processor (padded square, RGB)
    labels: PhantomLabels


def held_out_phantoms(count: int, start_seed: int = 0, rows: int = 512) -> list[HeldOutPhantom]:
    """Phantoms never seen in training, through the serving preprocessing (8-bit, zero-pad to square, RGB)."""
    from medgemma_xray.phantoms.films import quantize
    from medgemma_xray.phantoms.labelled import labelled_phantom
    from medgemma_xray.xray_io import Radiograph
    from medgemma_xray.xray_io.preprocess import model_input_image

    if start_seed < 0 or start_seed + count > HELD_OUT_SEED_LIMIT:
        raise ValueError(f"held-out seeds must lie in 0..{HELD_OUT_SEED_LIMIT - 1}; training uses the rest")
    phantoms = []
    for seed in range(start_seed, start_seed + count):
        phantom = labelled_phantom(seed, rows)
        film = Radiograph(quantize(phantom.film, 8), "synthetic phantom")
        phantoms.append(HeldOutPhantom(f"phantom-{seed:06d}", model_input_image(film), phantom.labels))
    return phantoms


def parse_yes_no(answer: str) -> bool | None:
    """True for an answer that starts with yes, False for no, None when it says neither."""
    match = re.match(r"\W*(yes|no)\b", answer.strip().lower())
    return None if match is None else match.group(1) == "yes"


def answer_confidence(token_logprobs: Sequence[float] | None) -> float | None:
    """exp(mean log-probability) of the answer's tokens: the geometric-mean probability the model gave them."""
    if not token_logprobs:
        return None
    return math.exp(sum(token_logprobs) / len(token_logprobs))


def f1_counts(truth: Sequence[bool], predicted: Sequence[bool | None]) -> dict:
    """Precision, recall and F1 of the positive class. An unparsed answer counts as wrong: a false negative when
    the finding is present, a false positive when it is absent."""
    tp = sum(1 for t, p in zip(truth, predicted, strict=True) if t and p is True)
    fn = sum(1 for t, p in zip(truth, predicted, strict=True) if t and p is not True)
    fp = sum(1 for t, p in zip(truth, predicted, strict=True) if not t and p is not False)
    tn = len(truth) - tp - fn - fp
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0  # no positives and none claimed: perfect
    return {
        "f1": f1,
        "precision": precision,
        "recall": recall,
        "accuracy": (tp + tn) / len(truth) if truth else 0.0,
        "support": tp + fn,
        "count": len(truth),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "unparsed": sum(1 for p in predicted if p is None),
    }


def expected_calibration_error(confidences: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS) -> float:
    """ECE over equal-width confidence bins: sum over bins of (bin share) x |accuracy - mean confidence|."""
    if len(confidences) != len(correct):
        raise ValueError(f"{len(confidences)} confidences but {len(correct)} correctness flags")
    if not confidences:
        raise ValueError("expected_calibration_error needs at least one answer")
    if any(not 0.0 <= c <= 1.0 for c in confidences):
        raise ValueError("confidences must lie in [0, 1]")
    totals = [[0, 0.0, 0] for _ in range(bins)]  # count, confidence sum, correct count
    for confidence, right in zip(confidences, correct, strict=True):
        index = min(int(confidence * bins), bins - 1)
        totals[index][0] += 1
        totals[index][1] += confidence
        totals[index][2] += int(right)
    n = len(confidences)
    return sum(count / n * abs(hits / count - conf_sum / count) for count, conf_sum, hits in totals if count)


def task_accuracy(
    backend,
    phantoms: Sequence[HeldOutPhantom],
    findings: Sequence[str] = FINDINGS,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    share_film_prefix: bool = False,
    progress=None,
) -> dict:
    """Ask every phantom every finding's canonical question; score per-finding F1, macro-F1 and ECE.

    progress: called once per phantom done (a progress bar), if given.
    share_film_prefix: ask a phantom's questions as one case (conversation_id and image_key set), so a backend that
    keeps a case's KV cache encodes the film and prefills its tokens once, not once per finding. The contract
    promises the same answer either way; on a CPU it makes the eight questions about five times cheaper.
    Returns {"per_finding": {finding: {...f1_counts}}, "macro_f1", "ece", "answers": [...], "phantoms", ...}.
    """
    from medgemma_xray.inference_api.contract import ChatTurn, GenerationRequest, GenerationStats
    from medgemma_xray.phantoms.questions import FINDING_QUESTIONS

    if not phantoms:
        raise ValueError("task_accuracy needs at least one held-out phantom")
    answers = []
    for phantom in phantoms:
        for finding in findings:
            question = FINDING_QUESTIONS[finding][0]
            stats = GenerationStats()
            case = {"conversation_id": f"task-{phantom.name}", "image_key": phantom.name} if share_film_prefix else {}
            request = GenerationRequest(
                phantom.image, (ChatTurn("user", question),), max_new_tokens=max_new_tokens, **case
            )
            text = "".join(backend.stream_generate(request, stats))
            predicted = parse_yes_no(text)
            truth = phantom.labels.present(finding)
            answers.append(
                {
                    "phantom": phantom.name,
                    "finding": finding,
                    "question": question,
                    "answer": text,
                    "truth": truth,
                    "predicted": predicted,
                    "correct": predicted is not None and predicted == truth,
                    "confidence": answer_confidence(getattr(stats, "token_logprobs", None)),
                }
            )
        if progress is not None:
            progress()
    return summarise(answers, findings, len(phantoms))


def summarise(answers: list[dict], findings: Sequence[str], phantom_count: int) -> dict:
    per_finding = {}
    for finding in findings:
        rows = [a for a in answers if a["finding"] == finding]
        per_finding[finding] = f1_counts([r["truth"] for r in rows], [r["predicted"] for r in rows])
    scored = [a for a in answers if a["confidence"] is not None]
    ece = None
    if scored and len(scored) == len(answers):
        ece = expected_calibration_error([a["confidence"] for a in scored], [a["correct"] for a in scored])
    elif scored:
        logger.warning("only %d of %d answers carry log-probabilities; ECE left out", len(scored), len(answers))
    return {
        "phantoms": phantom_count,
        "per_finding": per_finding,
        "macro_f1": sum(row["f1"] for row in per_finding.values()) / len(per_finding),
        "accuracy": sum(a["correct"] for a in answers) / len(answers),
        "ece": ece,
        "mean_confidence": sum(a["confidence"] for a in scored) / len(scored) if scored else None,
        "answers": answers,
    }


def compare_task_accuracy(reference: dict, candidate: dict, max_drop: float = 0.01) -> list[str]:
    """The precision gate: failures (empty when the candidate passes). max_drop is in F1 units (0.01 = 1 point)
    of macro-F1 below the reference. Both results must cover the same findings and phantom count."""
    if set(reference["per_finding"]) != set(candidate["per_finding"]):
        return [
            f"findings differ: reference {sorted(reference['per_finding'])}, candidate {sorted(candidate['per_finding'])}"
        ]
    if reference["phantoms"] != candidate["phantoms"]:
        return [f"phantom counts differ: reference {reference['phantoms']}, candidate {candidate['phantoms']}"]
    drop = reference["macro_f1"] - candidate["macro_f1"]
    if drop > max_drop + 1e-12:
        worst = sorted(
            (
                (reference["per_finding"][f]["f1"] - candidate["per_finding"][f]["f1"], f)
                for f in reference["per_finding"]
            ),
            reverse=True,
        )[:3]
        detail = ", ".join(f"{f} {-d * 100:+.1f}" for d, f in worst if d > 0)
        return [
            f"macro-F1 dropped {drop * 100:.1f} points ({reference['macro_f1'] * 100:.1f} -> "
            f"{candidate['macro_f1'] * 100:.1f}), more than the allowed {max_drop * 100:.1f}; worst: {detail}"
        ]
    return []


def format_table(results: dict[str, dict]) -> str:
    """A Markdown table: one row per finding, one F1 column per backend, then macro-F1 and ECE."""
    names = list(results)
    findings = list(next(iter(results.values()))["per_finding"])
    lines = ["| finding | support | " + " | ".join(f"F1 {n}" for n in names) + " |", "|---|---|" + "---|" * len(names)]
    for finding in findings:
        support = results[names[0]]["per_finding"][finding]["support"]
        cells = " | ".join(f"{results[n]['per_finding'][finding]['f1'] * 100:.1f}" for n in names)
        lines.append(f"| {finding} | {support}/{results[names[0]]['phantoms']} | {cells} |")
    lines.append("| **macro-F1** | | " + " | ".join(f"**{results[n]['macro_f1'] * 100:.1f}**" for n in names) + " |")
    ece_cells = " | ".join("n/a" if results[n]["ece"] is None else f"{results[n]['ece']:.3f}" for n in names)
    lines.append(f"| ECE (confidence) | | {ece_cells} |")
    return "\n".join(lines)
