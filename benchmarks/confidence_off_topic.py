"""Is the confidence an answer shows calibrated, once questions the film cannot answer are asked too?

  .venv/bin/python -m benchmarks.confidence_off_topic [--films 6] [--max-new-tokens 32] [--output results.md]

The demo model (PyTorch, CPU) answers on labelled phantoms (medgemma_xray.phantoms.labelled, held-out seeds):
- on the film: a yes/no question per finding, right when its first word matches the phantom's label;
- not about the film (the capital of France, a haiku, ...) and not answerable from it (the patient's age, a prior
  film that is not loaded, ...): never right, since nothing the film model says answers them.
"Before" shows every answer's confidence (the geometric-mean token probability, assistant.confidence); "after"
withholds it where assistant.question_scope says the question is off the film, as the main page does. Per group:
how many answers show a figure and its mean; over the answers that show one: the expected calibration error (10
equal-width bins), the Brier score, and how many show >= 80 % while not right.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIRST_SEED = 930_000  # held out from training (below 1,000,000 is never trained on by the demo model's corpus)
ON_FILM = {
    "pleural_effusion": "Is there a pleural effusion?",
    "pneumothorax": "Is there a pneumothorax?",
    "cardiomegaly": "Is the heart enlarged?",
    "nodule_or_mass": "Is there a nodule or mass?",
    "consolidation": "Is there consolidation?",
    "endotracheal_tube": "Is there an endotracheal tube?",
    "central_line": "Is there a central line?",
    "pacemaker": "Is there a pacemaker?",
}
NOT_ABOUT_THE_FILM = (
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Who won the 2018 World Cup?",
    "What is 17 times 23?",
    "Tell me a joke.",
    "How do I bake sourdough bread?",
    "Translate good morning into Spanish.",
    "What will the weather be tomorrow?",
    "Summarise the plot of Hamlet.",
    "Which programming language is best?",
)
NOT_FROM_THE_FILM = (
    "How old is the patient?",
    "What is the patient's name?",
    "What antibiotic should the patient take?",
    "What was the white cell count?",
    "Does the patient smoke?",
    "Has this gotten worse since the last film?",
    "What is the prognosis?",
    "What are the patient's symptoms?",
)


def _answers(films: int, max_new_tokens: int) -> list[dict]:
    from medgemma_xray.assistant.confidence import answer_confidence
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
    from medgemma_xray.phantoms.films import png_bytes, quantize
    from medgemma_xray.phantoms.labelled import labelled_phantom
    from medgemma_xray.pytorch_backend.eager import TorchInference
    from medgemma_xray.xray_io import load_radiograph
    from medgemma_xray.xray_io.preprocess import model_input_image

    backend = TorchInference(REPO / "models" / "medgemma-demo", device="cpu")
    rows = []
    try:
        for seed in range(FIRST_SEED, FIRST_SEED + films):
            phantom = labelled_phantom(seed)
            image = model_input_image(load_radiograph(png_bytes(quantize(phantom.film, 8))))
            asked = [("on the film", q, finding) for finding, q in ON_FILM.items()]
            asked += [("not about the film", q, None) for q in NOT_ABOUT_THE_FILM]
            asked += [("not from the film", q, None) for q in NOT_FROM_THE_FILM]
            for group, question, finding in asked:
                stats = GenerationStats()
                request = GenerationRequest(image=image, turns=(ChatTurn("user", question),),
                                            max_new_tokens=max_new_tokens)  # fmt: skip
                text = backend.generate(request, stats)
                confidence = answer_confidence(stats.token_ids, stats.token_logprobs, stats.token_texts)
                first = text.strip().split(maxsplit=1)[0].strip(".,!").lower() if text.strip() else ""
                right = (
                    finding is not None
                    and first in ("yes", "no")
                    and (first == "yes") == phantom.labels.present(finding)
                )
                rows.append({"seed": seed, "group": group, "question": question, "answer": text.strip()[:120],
                             "confidence": None if confidence is None else confidence.mean_probability,
                             "right": bool(right)})  # fmt: skip
    finally:
        backend.close()
    return rows


def _metrics(rows: list[dict], shown) -> dict:
    """shown(row) -> the confidence on screen, or None when withheld."""
    groups = {}
    for group in ("on the film", "not about the film", "not from the film"):
        members = [row for row in rows if row["group"] == group]
        figures = [shown(row) for row in members if shown(row) is not None]
        groups[group] = {
            "answers": len(members),
            "shown": len(figures),
            "mean_shown": sum(figures) / len(figures) if figures else None,
            "right": sum(row["right"] for row in members),
        }
    pairs = [(shown(row), row["right"]) for row in rows if shown(row) is not None]
    bins = [[] for _ in range(10)]
    for probability, right in pairs:
        bins[min(int(probability * 10), 9)].append((probability, right))
    ece = sum(
        len(b) / len(pairs) * abs(sum(p for p, _ in b) / len(b) - sum(r for _, r in b) / len(b)) for b in bins if b
    ) if pairs else None  # fmt: skip
    brier = sum((p - r) ** 2 for p, r in pairs) / len(pairs) if pairs else None
    return {
        "groups": groups,
        "shown": len(pairs),
        "ece": ece,
        "brier": brier,
        "confident_not_right": sum(1 for p, r in pairs if p >= 0.8 and not r),
    }


def _table(before: dict, after: dict) -> list[str]:
    def pct(value) -> str:
        return "–" if value is None else f"{value:.0%}"

    lines = ["| group | answers | right | shown before | mean shown before | shown after | mean shown after |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for group, b in before["groups"].items():
        a = after["groups"][group]
        lines.append(f"| {group} | {b['answers']} | {b['right']} | {b['shown']} | {pct(b['mean_shown'])} | "
                     f"{a['shown']} | {pct(a['mean_shown'])} |")  # fmt: skip
    lines += ["", "| over the answers that show a figure | before | after |", "|---|---|---|"]
    lines.append(f"| answers with a figure | {before['shown']} | {after['shown']} |")
    lines.append(f"| expected calibration error (10 bins) | {before['ece']:.3f} | {after['ece']:.3f} |")
    lines.append(f"| Brier score | {before['brier']:.3f} | {after['brier']:.3f} |")
    lines.append(f"| shown >= 80 % and not right | {before['confident_not_right']} | {after['confident_not_right']} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    from medgemma_xray.assistant.question_scope import confidence_withheld

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--films", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--output", type=Path, help="write the Markdown table here (and the rows as .json beside)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = _answers(args.films, args.max_new_tokens)
    before = _metrics(rows, lambda row: row["confidence"])
    after = _metrics(rows, lambda row: None if confidence_withheld(row["question"]) else row["confidence"])
    command = "python -m benchmarks.confidence_off_topic " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Confidence on and off the film: before and after withholding it",
        "",
        f"Date: {datetime.date.today().isoformat()} · machine: {platform.node()} ({platform.machine()}, "
        f"{__import__('os').cpu_count()} cores, CPU) · model: the demo model (PyTorch, fp32) · "
        f"{args.films} phantoms (seeds from {FIRST_SEED}), {args.max_new_tokens} new tokens · "
        f"{time.monotonic() - started:.0f} s",
        f"Command: `{command.strip()}`",
        "",
        *_table(before, after),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
        args.output.with_suffix(".json").write_text(
            json.dumps({"before": before, "after": after, "rows": rows}, indent=1, default=str) + "\n"
        )
    return 0 if all(math.isfinite(v) for v in (before["ece"], after["ece"])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
