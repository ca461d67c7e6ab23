"""The accuracy gate's rule, written once: the build applies it to what it measured, the runtime re-applies it to
the figures the manifest records (not only its `passed` field), and both say which executor the figures belong to.

A bundle's figures are comparisons with PyTorch on held-out films (short questions) and on one long multi-turn
conversation (where low-precision rotary embeddings and attention drift). They hold for the executor that ran
them: ONNX Runtime's figures say nothing about TensorRT plans that were never run, and the reverse.
"""

from __future__ import annotations

from typing import Any

# Fewer held-out films than this is too few to judge a precision (one odd film decides the verdict).
MIN_HELD_OUT_FILMS = 4
HELD_OUT_FRACTION = 0.1
# The long case's prompt, in tokens: a teaching round's conversation about one film.
LONG_CONVERSATION_TOKENS = 1536
UNVERIFIED_NOTICE = "accuracy not verified on this executor"


def held_out_count(films: int) -> int:
    """How many of `films` the build holds out for the gate: the same rule for every precision."""
    return max(MIN_HELD_OUT_FILMS, int(round(films * HELD_OUT_FRACTION)))


def _at_least(value: float | None, minimum: float, label: str, fmt: str) -> str | None:
    if value is None:
        return f"{label} was not measured"
    return None if value >= minimum else f"{label} {value:{fmt}} < {minimum}"


def _at_most(value: float | None, maximum: float, label: str, fmt: str, unit: str = "") -> str | None:
    if value is None:
        return None  # nothing to compare: no token in common, or no distribution recorded
    return None if value <= maximum else f"{label} {value:{fmt}} > {maximum}{unit}"


def gate_failures(figures: dict[str, Any], thresholds: dict[str, Any]) -> list[str]:
    """Every threshold the figures miss, in words; empty when they pass. Missing thresholds are failures."""
    missing = [
        key
        for key in ("min_cosine", "min_token_agreement", "max_logprob_delta", "max_kl")
        if not isinstance(thresholds.get(key), (int, float))
    ]
    if missing:
        return [f"the record holds no threshold for {', '.join(missing)}"]
    checks = [
        _at_least(figures.get("image_embedding_cosine_min"), thresholds["min_cosine"], "image embedding cosine", ".5f"),
        _at_least(figures.get("token_agreement_mean"), thresholds["min_token_agreement"], "token agreement", ".3f"),
        _at_most(
            figures.get("logprob_delta_max"),
            thresholds["max_logprob_delta"],
            "token log-probability delta",
            ".4f",
            " nats",
        ),
        _at_most(figures.get("first_token_kl_max"), thresholds["max_kl"], "first-token KL", ".5f"),
    ]
    long_case = figures.get("long_conversation")
    if not isinstance(long_case, dict):
        checks.append(f"the long conversation (>= {LONG_CONVERSATION_TOKENS} tokens) was not measured")
    else:
        label = f"long conversation ({long_case.get('prompt_tokens')} tokens)"
        minimum = thresholds.get("min_long_token_agreement", thresholds["min_token_agreement"])
        checks += [
            _at_least(long_case.get("token_agreement"), minimum, f"{label} token agreement", ".3f"),
            _at_most(long_case.get("first_token_kl"), thresholds["max_kl"], f"{label} first-token KL", ".5f"),
        ]
    films = figures.get("films")
    if not isinstance(films, int) or films < MIN_HELD_OUT_FILMS:
        checks.append(f"measured on {films} held-out films, fewer than the {MIN_HELD_OUT_FILMS} needed to judge")
    return [failure for failure in checks if failure]


def recorded_failures(accuracy: dict[str, Any]) -> list[str]:
    """The gate re-applied to a manifest's accuracy record: its figures against its own thresholds."""
    thresholds = accuracy.get("thresholds")
    if not isinstance(thresholds, dict):
        return ["the record holds no thresholds"]
    failures = gate_failures(accuracy, thresholds)
    task = accuracy.get("task_accuracy")
    if isinstance(task, dict) and task.get("enabled"):
        drop, allowed = task.get("macro_f1_drop"), thresholds.get("max_macro_f1_drop", task.get("max_macro_f1_drop"))
        if not isinstance(drop, (int, float)) or not isinstance(allowed, (int, float)) or drop > allowed:
            failures.append(f"task macro-F1 drop {drop} > {allowed}")
    return failures


def unverified_reason(accuracy: dict[str, Any], executor: str) -> str:
    """Why the accuracy record does not cover `executor` ('' when it does): the figures belong to the executor
    that measured them, and TensorRT plans count as measured only where the build ran them (plans_verified)."""
    measured = accuracy.get("executor")
    if executor == "tensorrt":
        if measured == "tensorrt" and accuracy.get("plans_verified") is True:
            return ""
        return (
            f"its TensorRT plans were never run against PyTorch (plans_verified: {accuracy.get('plans_verified')}; "
            f"the figures were measured on {measured})"
        )
    if measured == executor:
        return ""
    return f"its figures were measured on {measured}, not on {executor}"
