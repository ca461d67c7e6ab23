"""Localisation and change-detection accuracy on held-out phantoms, through any InferenceBackend.

Localisation: every held-out film is asked grounding.prompts.localisation_prompt(<finding's name>) for each finding
(regions.object_name), the answer's boxes are parsed in the film's frame (grounding.boxes.parse_boxes, after
strip_thinking) and each ground-truth region (phantoms.regions) is scored by its best IoU with any box the model
gave: 0 when it gave none or the answer held no box list. Per finding: mean and median IoU, hit rate at IoU >= 0.3
and >= 0.5. Findings the film does not show are asked too: the right answer is an empty list (`Final Answer: []`),
and the share of such answers is reported (absent_empty_rate).

Change detection: every held-out progression pair is asked the comparison prompt with the prior and the current
film in one request (GenerationRequest.prior_image), the answer is read by progression.parse_change_statement and
is right when it names exactly the pair's changes (and "no interval change" exactly when there are none).

Held-out seeds are below evaluation.HELD_OUT_SEED_LIMIT, as for task accuracy; training never draws them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from medgemma_xray.phantoms.evaluation import HELD_OUT_SEED_LIMIT
from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels

HIT_THRESHOLDS = (0.3, 0.5)
LOCALISATION_MAX_NEW_TOKENS = 160  # a reasoning sentence and two boxes, digit by digit
COMPARISON_MAX_NEW_TOKENS = 80


@dataclass(frozen=True)
class GroundingPhantom:
    name: str
    image: object  # the PIL image the server hands the processor (padded square, RGB)
    labels: PhantomLabels
    rows: int  # the film's own size: boxes are mapped back to it from the padded square
    cols: int
    regions: tuple  # phantoms.regions.Region of every present finding


@dataclass(frozen=True)
class HeldOutPair:
    name: str
    prior_image: object
    current_image: object
    kind: str
    changes: frozenset  # (finding, kind) pairs; empty for no change


def _check_seeds(count: int, start_seed: int) -> None:
    if count < 1:
        raise ValueError("ask for at least one held-out phantom")
    if start_seed < 0 or start_seed + count > HELD_OUT_SEED_LIMIT:
        raise ValueError(f"held-out seeds must lie in 0..{HELD_OUT_SEED_LIMIT - 1}; training uses the rest")


def _served(film):
    from medgemma_xray.phantoms.films import quantize
    from medgemma_xray.xray_io import Radiograph
    from medgemma_xray.xray_io.preprocess import model_input_image

    return model_input_image(Radiograph(quantize(film, 8), "synthetic phantom"))


def grounding_phantoms(count: int, start_seed: int = 0, rows: int = 512) -> list[GroundingPhantom]:
    """Held-out phantoms through the serving preprocessing (8-bit, zero-pad to square, RGB), with their regions."""
    from medgemma_xray.phantoms.regions import phantom_with_regions

    _check_seeds(count, start_seed)
    phantoms = []
    for seed in range(start_seed, start_seed + count):
        phantom, regions = phantom_with_regions(seed, rows)
        film_rows, film_cols = phantom.film.shape
        phantoms.append(
            GroundingPhantom(
                f"phantom-{seed:06d}", _served(phantom.film), phantom.labels, film_rows, film_cols, regions
            )
        )
    return phantoms


def held_out_pairs(count: int, start_seed: int = 0) -> list[HeldOutPair]:
    """Held-out progression pairs (phantoms.progression), both films through the serving preprocessing."""
    from medgemma_xray.phantoms.progression import progression_pair

    _check_seeds(count, start_seed)
    pairs = []
    for seed in range(start_seed, start_seed + count):
        pair = progression_pair(seed)
        changes = frozenset((change.finding, change.kind) for change in pair.changes)
        pairs.append(
            HeldOutPair(f"pair-{seed:06d}", _served(pair.prior.film), _served(pair.current.film), pair.kind, changes)
        )
    return pairs


def _ask(backend, request) -> str:
    from medgemma_xray.grounding.prompts import strip_thinking
    from medgemma_xray.inference_api.contract import GenerationStats

    return strip_thinking("".join(backend.stream_generate(request, GenerationStats())))


def best_iou(region_box, boxes) -> float:
    from medgemma_xray.grounding.boxes import iou

    return max((iou(region_box, box) for box in boxes), default=0.0)


def localisation_accuracy(
    backend,
    phantoms: Sequence[GroundingPhantom],
    findings: Sequence[str] = FINDINGS,
    max_new_tokens: int = LOCALISATION_MAX_NEW_TOKENS,
    ask_absent: bool = True,
    progress=None,
) -> dict:
    """Ask each phantom where each finding is; score IoU per ground-truth region (see the module's docstring).

    Returns {"per_finding": {finding: {...}}, "overall": {...}, "answers": [...], "phantoms": n}.
    """
    from medgemma_xray.grounding.prompts import localisation_prompt
    from medgemma_xray.inference_api.contract import ChatTurn, GenerationRequest
    from medgemma_xray.phantoms.regions import object_name

    if not phantoms:
        raise ValueError("localisation_accuracy needs at least one held-out phantom")
    answers = []
    for phantom in phantoms:
        for finding in findings:
            truth = [region for region in phantom.regions if region.finding == finding]
            if not truth and not ask_absent:
                continue
            request = GenerationRequest(
                phantom.image,
                (ChatTurn("user", localisation_prompt(object_name(finding))),),
                max_new_tokens=max_new_tokens,
                conversation_id=f"where-{phantom.name}",
                image_key=phantom.name,
            )
            answers.append(score_localisation_answer(phantom, finding, _ask(backend, request)))
        if progress is not None:
            progress()
    return summarise_localisation(answers, findings, len(phantoms))


def score_localisation_answer(phantom: GroundingPhantom, finding: str, text: str) -> dict:
    """One answer scored: its boxes in the film's frame and each ground-truth region's best IoU with them."""
    from medgemma_xray.grounding.boxes import BoxFormatError, parse_boxes

    truth = [region for region in phantom.regions if region.finding == finding]
    try:
        result = parse_boxes(text, phantom.rows, phantom.cols)
        boxes, refused, parsed = result.boxes, result.refused, True
    except BoxFormatError:
        boxes, refused, parsed = (), (), False
    return {
        "phantom": phantom.name,
        "finding": finding,
        "present": bool(truth),
        "answer": text,
        "parsed": parsed,
        "boxes": [[b.y0, b.x0, b.y1, b.x1] for b in boxes],
        "refused": list(refused),  # items of the list that were no valid box (outside the film, unordered)
        "ious": [best_iou(region.box, boxes) for region in truth],
    }


def _iou_figures(ious: list[float]) -> dict:
    figures = {
        "regions": len(ious),
        "mean_iou": statistics.fmean(ious) if ious else None,
        "median_iou": statistics.median(ious) if ious else None,
    }
    for threshold in HIT_THRESHOLDS:
        figures[f"hit_rate_{threshold}"] = sum(v >= threshold for v in ious) / len(ious) if ious else None
    return figures


def summarise_localisation(answers: list[dict], findings: Sequence[str], phantom_count: int) -> dict:
    per_finding = {}
    for finding in findings:
        rows = [a for a in answers if a["finding"] == finding]
        present = [a for a in rows if a["present"]]
        absent = [a for a in rows if not a["present"]]
        figures = _iou_figures([v for a in present for v in a["ious"]])
        figures["present_asked"] = len(present)
        figures["unparsed"] = sum(not a["parsed"] for a in present)
        figures["absent_asked"] = len(absent)
        figures["absent_empty_rate"] = (
            sum(a["parsed"] and not a["boxes"] and not a["refused"] for a in absent) / len(absent) if absent else None
        )
        per_finding[finding] = figures
    overall = _iou_figures([v for a in answers if a["present"] for v in a["ious"]])
    return {"phantoms": phantom_count, "per_finding": per_finding, "overall": overall, "answers": answers}


def change_detection_accuracy(
    backend, pairs: Sequence[HeldOutPair], max_new_tokens: int = COMPARISON_MAX_NEW_TOKENS, progress=None
) -> dict:
    """Ask each pair what changed (prior and current film in one request); right when the answer names exactly the
    pair's changes. Returns {"accuracy", "per_kind": {kind: {"accuracy", "count"}}, "unparsed", "answers"}."""
    from medgemma_xray.grounding.prompts import COMPARISON_PROMPT
    from medgemma_xray.inference_api.contract import ChatTurn, GenerationRequest

    if not pairs:
        raise ValueError("change_detection_accuracy needs at least one held-out pair")
    answers = []
    for pair in pairs:
        request = GenerationRequest(
            pair.current_image,
            (ChatTurn("user", COMPARISON_PROMPT),),
            max_new_tokens=max_new_tokens,
            prior_image=pair.prior_image,
        )
        answers.append(score_change_answer(pair, _ask(backend, request)))
        if progress is not None:
            progress()
    return summarise_changes(answers)


def score_change_answer(pair: HeldOutPair, text: str) -> dict:
    """One comparison answer scored: right when it states exactly the pair's changes."""
    from medgemma_xray.phantoms.progression import parse_change_statement

    stated = parse_change_statement(text)
    return {
        "pair": pair.name,
        "kind": pair.kind,
        "truth": sorted(pair.changes),
        "stated": None if stated is None else sorted(stated),
        "answer": text,
        "correct": stated == pair.changes,
    }


def summarise_changes(answers: list[dict]) -> dict:
    per_kind = {}
    for kind in sorted({a["kind"] for a in answers}):
        rows = [a for a in answers if a["kind"] == kind]
        per_kind[kind] = {"accuracy": sum(a["correct"] for a in rows) / len(rows), "count": len(rows)}
    return {
        "pairs": len(answers),
        "accuracy": sum(a["correct"] for a in answers) / len(answers),
        "per_kind": per_kind,
        "unparsed": sum(a["stated"] is None for a in answers),
        "answers": answers,
    }


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}"


def format_localisation_table(result: dict) -> str:
    """Markdown: one row per finding (regions, mean and median IoU, hit rates, empty answers when absent)."""
    lines = [
        "| finding | regions | mean IoU | median IoU | hit@0.3 % | hit@0.5 % | unparsed | empty when absent % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [
        *result["per_finding"].items(),
        ("**all**", {**result["overall"], "unparsed": "", "absent_empty_rate": None}),
    ]
    for finding, row in rows:
        mean = "n/a" if row["mean_iou"] is None else f"{row['mean_iou']:.3f}"
        median = "n/a" if row["median_iou"] is None else f"{row['median_iou']:.3f}"
        lines.append(
            f"| {finding} | {row['regions']} | {mean} | {median} | {_percent(row['hit_rate_0.3'])} | "
            f"{_percent(row['hit_rate_0.5'])} | {row['unparsed']} | {_percent(row['absent_empty_rate'])} |"
        )
    return "\n".join(lines)


def format_change_table(result: dict) -> str:
    lines = ["| pair kind | pairs | accuracy % |", "|---|---|---|"]
    for kind, row in result["per_kind"].items():
        lines.append(f"| {kind} | {row['count']} | {_percent(row['accuracy'])} |")
    lines.append(f"| **all** | {result['pairs']} | **{_percent(result['accuracy'])}** |")
    return "\n".join(lines)
