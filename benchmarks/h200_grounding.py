"""MedGemma 1.5's two new prompts on the full-size MedGemma-4B shape (random weights), with a short table last:
"Where?" (one film, the localisation notebook's text) and "what changed?" (a prior film, then the current film,
then the text: the longitudinal notebook's order), through the fast path (CUDA graphs, bucketed and packed
prefill, paged KV, shared caches; --compile adds torch.compile) and the batch scheduler (several requests in one batch), each compared
with the eager reference (transformers' own forward, one request at a time) on 5 prompts.

  python3 -m benchmarks.h200_grounding --output $OUT                    # on the GPU host (about 4 minutes)
  python3 -m benchmarks.h200_grounding --output OUT --demo --device cpu  # the same code on the demo model

Random weights give real shapes and costs, not meaningful text. In bf16 two correct paths can part where the
reference's top two logits nearly tie; each divergence is shown with the eager top-1/top-2 margin where it
happened (gpu_checks.py does the same), so a tie is told from a misplaced film (which parts at the first token
with a wide margin). JSON in --output/h200_grounding.json, written after every phase.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

# The "what changed?" question; grounding.prompts' own comparison text is used instead where it has one.
CHANGE_QUESTION = "Compare the current chest X-ray with the prior one. What has changed?"
FINDINGS = ("pleural effusion", "cardiomegaly", "right upper lobe nodule")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--demo", action="store_true", help="the demo checkpoint instead of the 4B random shape")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per answer")
    parser.add_argument("--batch", type=int, default=8, help="requests the scheduler batches together")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the fast path's layers too (a cold compile took 126 s on the H200, 2026-12-01: over the "
        "budget; without it the same paged decoder, packed and bucketed prefill and CUDA graphs run, eager kernels)",
    )
    return parser.parse_args(argv)


def change_question() -> str:
    from medgemma_xray.grounding import prompts

    own = getattr(prompts, "comparison_prompt", None)  # the points branch may add the notebook's wording
    return own() if callable(own) else CHANGE_QUESTION


def make_requests(tokens: int):
    """5 prompts: "Where?" on three films (one finding each), "what changed?" on two prior/current pairs."""
    from medgemma_xray.grounding.prompts import localisation_prompt
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
    from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
    from medgemma_xray.xray_io import load_radiograph
    from medgemma_xray.xray_io.preprocess import model_input_image

    films = [model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in range(5)]
    where = [
        GenerationRequest(film, (ChatTurn("user", localisation_prompt(name)),), max_new_tokens=tokens)
        for film, name in zip(films[:3], FINDINGS, strict=True)
    ]
    question = change_question()
    changed = [
        GenerationRequest(films[b], (ChatTurn("user", question),), max_new_tokens=tokens, prior_image=films[a])
        for a, b in ((3, 0), (4, 1))
    ]
    return [("where", r) for r in where] + [("what_changed", r) for r in changed]


def eager_reference(eager, request):
    """The eager path's greedy tokens, and per step its top-1 minus top-2 logit margin (teacher-forced)."""
    import numpy as np

    from medgemma_xray.inference_api.types import GenerationStats

    stats = GenerationStats()
    eager.generate(request, stats)
    logits = eager.answer_logits(request, stats.token_ids)
    top = np.sort(logits, axis=-1)[:, -2:]
    return stats.token_ids, [float(m) for m in (top[:, 1] - top[:, 0])], stats.prompt_tokens


def first_divergence(expected: list[int], produced: list[int]) -> int | None:
    for index, (a, b) in enumerate(zip(expected, produced, strict=False)):
        if a != b:
            return index
    return None if len(expected) == len(produced) else min(len(expected), len(produced))


def through_scheduler(fast, requests, name: str) -> tuple[list[list[int]], float]:
    """All requests submitted at once to one scheduler: prefilled together (packed) and decoded as one batch."""
    from medgemma_xray.inference_api.types import GenerationStats
    from medgemma_xray.serving.scheduler import Scheduler

    stats = [GenerationStats() for _ in requests]
    scheduler = Scheduler(fast, max_active=len(requests), max_waiting=len(requests), name=name)
    started = time.perf_counter()
    try:
        tickets = [scheduler.submit(request, stat) for request, stat in zip(requests, stats, strict=True)]
        for ticket in tickets:
            "".join(ticket.deltas(600, 600))
    finally:
        scheduler.close(60)
    return [stat.token_ids for stat in stats], time.perf_counter() - started


def build(args):
    from medgemma_xray.pytorch_backend.eager import TorchInference
    from medgemma_xray.pytorch_backend.fast import FastTorchInference
    from medgemma_xray.serving.settings import DEMO_MODEL_DIR

    if args.demo:
        eager = TorchInference(DEMO_MODEL_DIR, device=args.device)
        preloaded, name = (eager.model, eager.processor), str(DEMO_MODEL_DIR)
    else:
        from benchmarks.random_model import random_medgemma_4b

        preloaded, name = random_medgemma_4b(DEMO_MODEL_DIR, args.device), "medgemma-4b-random"
        eager = TorchInference(name, preloaded=preloaded)
    fast = FastTorchInference(
        name,
        preloaded=preloaded,
        slots=max(16, args.batch),
        max_sequence=2048,
        max_resident_conversations=4,
        batch_buckets=(1, 2, 4, 8, 16),  # fewer graphs to capture: the start stays inside the time budget
        compile=args.compile,  # CUDA graphs stay on wherever CUDA is (the decode and prefill buckets, vision)
    )
    return eager, fast


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    args.output.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    result: dict = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "model": "demo checkpoint" if args.demo else "MedGemma-4B shape, random weights",
        "tokens": args.tokens,
    }

    def save() -> None:
        (args.output / "h200_grounding.json").write_text(json.dumps(result, indent=1, default=str))

    def mark(name: str) -> None:
        result.setdefault("seconds", {})[name] = round(time.perf_counter() - began, 1)
        print(f"[{time.perf_counter() - began:6.1f} s] {name}", flush=True)
        save()

    eager, fast = build(args)
    mark("built")
    fast.warm_up()  # compile and capture (decode buckets, prefill buckets, the vision tower) before timing
    result["fast_startup"] = fast.startup
    mark("fast path warmed up")
    prompts = make_requests(args.tokens)
    references = [eager_reference(eager, request) for _, request in prompts]
    result["prompt_tokens"] = {
        f"{kind}_{i}": ref[2] for i, ((kind, _), ref) in enumerate(zip(prompts, references, strict=True))
    }
    mark("eager reference")

    rows = []
    for index, ((kind, request), (expected, margins, prompt_tokens)) in enumerate(
        zip(prompts, references, strict=True)
    ):
        from medgemma_xray.inference_api.types import GenerationStats

        stats = GenerationStats()
        fast.generate(request, stats)
        where = first_divergence(expected, stats.token_ids)
        rows.append(
            {
                "prompt": index,
                "kind": kind,
                "prompt_tokens": prompt_tokens,
                "image_tokens": fast._encode_impl(request).ids.count(fast.image_token_id),
                "fast_equal": where is None,
                "fast_first_divergence": where,
                "eager_margin_there": margins[where] if where is not None and where < len(margins) else None,
                "fast_first_token_s": stats.first_token_s,
            }
        )
    result["fast_vs_eager"] = rows
    mark("fast path alone")

    # The scheduler: the 5 prompts and their copies (other requests in the batch), all at once, caches cold.
    batch = [request for _, request in prompts] * max(1, -(-args.batch // len(prompts)))
    batch = batch[: max(args.batch, len(prompts))]
    fast.forget_all()
    fast.prefix_cache.clear()
    fast.image_cache.clear()
    produced, seconds = through_scheduler(fast, batch, "grounding")
    scheduled = []
    for index, tokens in enumerate(produced):
        expected, margins, _ = references[index % len(prompts)]
        where = first_divergence(expected, tokens)
        scheduled.append(
            {
                "request": index,
                "prompt": index % len(prompts),
                "equal": where is None,
                "first_divergence": where,
                "eager_margin_there": margins[where] if where is not None and where < len(margins) else None,
            }
        )
    result["scheduler_vs_eager"] = {"rows": scheduled, "batch": len(batch), "seconds": round(seconds, 2)}
    result["cache_stats"] = fast.cache_stats()
    mark("scheduler batch")
    if args.device == "cuda":
        result["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    save()
    print(table(result))
    fast.close()
    eager.close()
    return 0


def table(result: dict) -> str:
    rows = result["fast_vs_eager"]
    scheduled = result["scheduler_vs_eager"]["rows"]
    lines = [
        f"\n{result['model']} on {result['device']}, {result['tokens']} greedy tokens, {result['date_utc']} UTC",
        "| prompt | kind | prompt tokens | image tokens | fast = eager | scheduler = eager |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        mine = [s for s in scheduled if s["prompt"] == row["prompt"]]
        fast = "yes" if row["fast_equal"] else f"parts at {row['fast_first_divergence']}"
        if not row["fast_equal"] and row["eager_margin_there"] is not None:
            fast += f" (margin {row['eager_margin_there']:.3f})"
        batched = f"{sum(s['equal'] for s in mine)}/{len(mine)}"
        lines.append(
            f"| {row['prompt']} | {row['kind']} | {row['prompt_tokens']} | {row['image_tokens']} | {fast} | {batched} |"
        )
    equal = sum(row["fast_equal"] for row in rows)
    batch_equal = sum(s["equal"] for s in scheduled)
    lines.append(
        f"| all | | | | {equal}/{len(rows)} | {batch_equal}/{len(scheduled)} "
        f"(batch of {result['scheduler_vs_eager']['batch']}) |"
    )
    seconds = result["seconds"]
    lines.append(
        f"seconds: built {seconds.get('built')}, warmed {seconds.get('fast path warmed up')}, "
        f"total {seconds.get('scheduler batch')}; peak GPU {result.get('peak_gpu_gib', '-')} GiB"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
