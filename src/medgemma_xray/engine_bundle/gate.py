"""The accuracy gate's rule, written once: the build applies it to what it measured, the runtime re-applies it to
the figures the manifest records (not only its `passed` field), and both say which executor the figures belong to.

A bundle's figures are comparisons with PyTorch on held-out films (short questions) and on one long multi-turn
conversation (where low-precision rotary embeddings and attention drift). The long case is judged over its whole
answer, not its first token: free-running greedy agreement, and with PyTorch's answer fed to both (teacher
forcing) the top-1 agreement and the KL divergence at every position, so that an answer whose first token agrees
and whose later tokens drift is caught. The figures hold for the executor that ran them: ONNX Runtime's figures
say nothing about TensorRT plans that were never run, and the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Fewer held-out films than this is too few to judge a precision (one odd film decides the verdict).
MIN_HELD_OUT_FILMS = 4
HELD_OUT_FRACTION = 0.1
# The long case's prompt, in tokens: a teaching round's conversation about one film.
LONG_CONVERSATION_TOKENS = 1536
UNVERIFIED_NOTICE = "accuracy not verified on this executor"
# The gate's thresholds when the build was not told otherwise. A bundle built with a looser one says so on every
# status surface (gate_figures(...).lowered).
DEFAULT_THRESHOLDS: dict[str, float] = {
    "min_cosine": 0.99,
    "min_token_agreement": 0.9,
    "min_long_token_agreement": 0.9,  # the long case's free-running greedy agreement
    "min_long_top1_agreement": 0.9,  # the long case's top-1 agreement on PyTorch's answer (teacher-forced)
    "max_logprob_delta": 0.1,  # nats, on the tokens both agree on
    "max_kl": 0.05,  # nats, the first answer token's distribution
    "max_long_kl": 0.05,  # nats, the largest KL over every position of the long case's answer
    "max_macro_f1_drop": 0.01,  # macro-F1 units: one point
}


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


def _required_at_most(value: float | None, maximum: float, label: str) -> str | None:
    if value is None:
        return f"{label} was not measured"
    return _at_most(value, maximum, label, ".5f")


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
        positions = long_case.get("answer_positions")
        whole = f"{label} over the whole answer ({positions} positions, PyTorch's answer fed to both)"
        checks += [
            _at_least(long_case.get("token_agreement"), minimum, f"{label} token agreement", ".3f"),
            _at_most(long_case.get("first_token_kl"), thresholds["max_kl"], f"{label} first-token KL", ".5f"),
            _at_least(
                long_case.get("top1_agreement"),
                thresholds.get("min_long_top1_agreement", DEFAULT_THRESHOLDS["min_long_top1_agreement"]),
                f"{whole}: top-1 agreement",
                ".3f",
            ),
            _required_at_most(
                long_case.get("kl_max"),
                thresholds.get("max_long_kl", DEFAULT_THRESHOLDS["max_long_kl"]),
                f"{whole}: largest KL (at answer position {long_case.get('kl_max_position')})",
            ),
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


@dataclass(frozen=True)
class GateFigure:
    """One figure of a bundle's accuracy record beside the threshold it passed and the default threshold."""

    key: str  # the figure's name in metrics: the threshold's name without min_/max_ (long_token_agreement)
    label: str
    value: float | None
    threshold: float | None
    default: float
    at_least: bool  # True: the figure must be >= the threshold; False: <=

    @property
    def lowered(self) -> bool:
        """The build accepted a looser threshold than the default."""
        if self.threshold is None:
            return False
        return self.threshold < self.default if self.at_least else self.threshold > self.default

    def text(self) -> str:
        value = "n/a" if self.value is None else f"{self.value:.4g}"
        text = f"{self.label} {value} ({'>=' if self.at_least else '<='} {self.threshold}"
        return text + (f", LOWERED from the default {self.default})" if self.lowered else ")")


def gate_figures(accuracy: dict[str, Any] | None) -> list[GateFigure]:
    """The figures a bundle passed, each with its threshold and the default: what every status surface shows."""
    if not isinstance(accuracy, dict):
        return []
    thresholds = accuracy.get("thresholds") or {}
    long_case = accuracy.get("long_conversation") or {}
    task = accuracy.get("task_accuracy") or {}
    tokens = long_case.get("prompt_tokens")

    def figure(label: str, value: float | None, key: str, at_least: bool) -> GateFigure:
        name = key.removeprefix("min_").removeprefix("max_")
        return GateFigure(name, label, value, thresholds.get(key), DEFAULT_THRESHOLDS[key], at_least)

    figures = [
        figure("token agreement", accuracy.get("token_agreement_mean"), "min_token_agreement", True),
        figure("first-token KL", accuracy.get("first_token_kl_max"), "max_kl", False),
        figure(
            f"long ({tokens} tokens) greedy agreement",
            long_case.get("token_agreement"),
            "min_long_token_agreement",
            True,
        ),
        figure(
            f"long ({tokens} tokens) top-1 agreement", long_case.get("top1_agreement"), "min_long_top1_agreement", True
        ),
        figure(f"long ({tokens} tokens) largest KL", long_case.get("kl_max"), "max_long_kl", False),
        figure("image embedding cosine", accuracy.get("image_embedding_cosine_min"), "min_cosine", True),
        figure("log-prob delta", accuracy.get("logprob_delta_max"), "max_logprob_delta", False),
    ]
    if task.get("enabled"):
        figures.append(figure("macro-F1 drop", task.get("macro_f1_drop"), "max_macro_f1_drop", False))
    return figures


def thresholds_lowered(accuracy: dict[str, Any] | None) -> bool:
    return any(figure.lowered for figure in gate_figures(accuracy))


def gate_summary(accuracy: dict[str, Any] | None) -> str:
    """One line: every gate figure with its threshold, thresholds below the default marked; '' without a record."""
    figures = gate_figures(accuracy)
    if not figures:
        return ""
    lowered = [figure for figure in figures if figure.lowered]
    head = f"{len(lowered)} threshold(s) LOWERED below the default; " if lowered else "default thresholds; "
    task = (accuracy or {}).get("task_accuracy") or {}
    tail = "" if task.get("enabled") else "; F1 gate not run"
    return head + "; ".join(figure.text() for figure in figures) + tail
