"""Task accuracy as the precision gate: the bundle must read held-out labelled phantoms as well as PyTorch does.

Cosine, token agreement and KL say how close the numbers are; this says whether the answers are still right. Each
phantom is asked every finding's yes/no question through both backends (medgemma_xray.phantoms.evaluation, imported lazily:
build-time code only), and the bundle fails when its macro-F1 falls more than max_drop below PyTorch's.

The rule is always the drop relative to PyTorch, never an absolute F1: a checkpoint that was not trained on phantoms
(real MedGemma, the random-weight demo) may score near chance, and then the gate still says whether the bundle
answers as PyTorch does, which is what a precision change must not alter. The record says when the reference
itself is near chance.
"""

from __future__ import annotations

import contextlib
import logging
import sys

logger = logging.getLogger(__name__)

DEFAULT_TASK_PHANTOMS = 24
DEFAULT_MAX_F1_DROP = 0.01  # one F1 point
# Seeds far from 0: calibration sets written by medgemma_xray.phantoms.films start at seed 0, and a gate measured on the
# calibration films would flatter the scales fit to them. Still below phantom_eval's held-out limit (training: above).
DEFAULT_TASK_SEED = 900_000
MAX_NEW_TOKENS = 4  # the verdict is the answer's first word
NEAR_CHANCE_MACRO_F1 = 0.6
REMEDY = (
    "Rebuild with more (and more varied) calibration films, --calibration_method entropy, or a higher --precision "
    "(fp16, fp32); or keep this precision and accept the drop with a larger --max_f1_drop"
)


def measure_task_accuracy(reference, bundle, phantoms: int, start_seed: int, max_drop: float) -> dict:
    """Both backends on the same held-out phantoms. Returns the manifest's task-accuracy record (per-finding F1
    for each, macro-F1, ECE, the drop, passed/failures); phantoms == 0 records that the gate was switched off."""
    if phantoms <= 0:
        return {
            "enabled": False,
            "passed": True,
            "failures": [],
            "note": "task accuracy not measured (--task_phantoms 0): this bundle was gated on embedding cosine, "
            "token agreement, log-probability delta and KL only, not on whether its answers are right",
        }
    from medgemma_xray.phantoms.evaluation import compare_task_accuracy, held_out_phantoms, task_accuracy

    films = held_out_phantoms(phantoms, start_seed)
    results = {}
    for name, backend in (("pytorch", reference), ("bundle", bundle)):
        with _progress(len(films), f"F1 gate, {name}") as advance:
            results[name] = task_accuracy(
                backend, films, max_new_tokens=MAX_NEW_TOKENS, share_film_prefix=True, progress=advance
            )
    failures = compare_task_accuracy(results["pytorch"], results["bundle"], max_drop=max_drop)
    if failures:
        failures = [f"{failures[0]} on {phantoms} held-out phantoms (seeds {start_seed}..{start_seed + phantoms - 1})"]
    record = {
        "enabled": True,
        "phantoms": phantoms,
        "seeds": [start_seed, start_seed + phantoms - 1],
        "max_new_tokens": MAX_NEW_TOKENS,
        "max_macro_f1_drop": max_drop,
        "macro_f1_drop": results["pytorch"]["macro_f1"] - results["bundle"]["macro_f1"],
        "pytorch": _summary(results["pytorch"]),
        "bundle": _summary(results["bundle"]),
        "passed": not failures,
        "failures": failures,
    }
    if results["pytorch"]["macro_f1"] < NEAR_CHANCE_MACRO_F1:
        record["note"] = (
            f"PyTorch's own macro-F1 is {results['pytorch']['macro_f1']:.2f}: this checkpoint does not read phantoms, "
            "so the gate only shows that the bundle answers as PyTorch does"
        )
    return record


@contextlib.contextmanager
def _progress(total: int, title: str):
    """A tqdm bar on stderr over the phantoms (the F1 gate takes minutes on a CPU); yields its advance()."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=title, unit="phantom", file=sys.stderr)
    try:
        yield lambda: bar.update(1)
    finally:
        bar.close()


def _summary(result: dict) -> dict:
    """What the manifest keeps of a phantom_eval result: everything but the individual answers."""
    return {key: value for key, value in result.items() if key != "answers"}


def table(record: dict) -> str:
    """The per-finding F1 table (Markdown) of a task-accuracy record; empty when the gate was off."""
    if not record.get("enabled"):
        return ""
    from medgemma_xray.phantoms.evaluation import format_table

    return format_table({"PyTorch": record["pytorch"], "bundle": record["bundle"]})


def failure_message(record: dict) -> str:
    return "; ".join(record["failures"]) + f". {REMEDY}"
