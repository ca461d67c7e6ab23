"""GPU checks of the paged, overlapped fast path on the MedGemma-4B shape (random weights), short table last.

  python3 -m benchmarks.paged_checks --output $OUT            # on the GPU host

1. The paged decode-attention kernel (plain, with the KV write, with the q/k norm and rotary) and the paged
   prefill-attention kernel against their torch references, bf16, at the real head shapes, on shuffled pages.
2. The several-row 8-bit GEMM against the bf16 product (cuBLAS) and the one-row GEMV, per matrix and row count:
   time (cold weights, median) and the crossover.
3. Exactness on the full-size model (bf16 and int8 modes): 10 prompts x 64 tokens, each answered alone (the
   synchronous path), together through the scheduler (batched, overlapped, paged), and again on the same film
   (prefix pages shared by reference) must give the same greedy tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.gpu_checks import QUESTIONS

SHAPES = {"qkv": (4096, 2560), "o": (2560, 2048), "gate_up": (20480, 2560), "down": (2560, 10240)}
ROWS = (1, 4, 8, 16, 32, 48, 64, 96, 128)


def relative(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def kernel_checks() -> dict:
    import torch

    from medgemma_xray.pytorch_backend.decode_attention import (
        PAGE_TOKENS,
        reference_decode_attention,
        reference_write_decode_attention,
        triton_decode_attention,
    )
    from medgemma_xray.pytorch_backend.prefill_attention import (
        PrefillChunk,
        PrefillPlan,
        reference_prefill_attention,
        triton_prefill_attention,
    )

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    pages, rows = 800, 24
    k_cache = torch.randn(pages + 1, PAGE_TOKENS, 4, 256, device=dev, dtype=dt)
    v_cache = torch.randn(pages + 1, PAGE_TOKENS, 4, 256, device=dev, dtype=dt)
    tables = torch.randperm(pages, device=dev)[: rows * 32].view(rows, 32).to(torch.int32)
    results = {}
    for window in (0, 256):
        q = torch.randn(16, 8, 256, device=dev, dtype=dt)
        which = torch.randperm(rows, device=dev)[:16]
        lengths = torch.randint(1, 32 * PAGE_TOKENS, (16,), device=dev)
        expected = reference_decode_attention(q, k_cache, v_cache, tables, which, lengths, window, 1 / 16)
        produced = triton_decode_attention(q, k_cache, v_cache, tables, which, lengths, window, 1 / 16)
        results[f"decode_window_{window}"] = relative(produced, expected)
        k, v = torch.randn(16, 4, 256, device=dev, dtype=dt), torch.randn(16, 4, 256, device=dev, dtype=dt)
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        positions = lengths - 1
        expected = reference_write_decode_attention(q, k, v, k_ref, v_ref, tables, which, positions, window, 1 / 16)
        produced = triton_decode_attention(
            q, k_cache, v_cache, tables, which, positions, window, 1 / 16, new_k=k, new_v=v
        )
        results[f"decode_write_window_{window}"] = max(relative(produced, expected), relative(k_cache, k_ref))
    chunks, blocks = [], []
    for row, (start, end, image) in enumerate(((0, 300, (10, 266)), (272, 420, (10, 266)), (0, 40, None))):
        ids = [-1] * end
        if image:
            ids[image[0] : image[1]] = [0] * (image[1] - image[0])
        chunks.append(PrefillChunk(row, start, end, ids))
        blocks.append(end - start)
    plan = PrefillPlan.build(chunks, torch.device(dev))
    q = torch.randn(sum(blocks), 8, 256, device=dev, dtype=dt)
    for window in (0, 128):
        expected = reference_prefill_attention(q, k_cache, v_cache, tables, plan, window, 1 / 16)
        produced = triton_prefill_attention(q, k_cache, v_cache, tables, plan, window, 1 / 16)
        results[f"prefill_window_{window}"] = relative(produced, expected)
    return results


def gemm_table() -> dict:
    import torch
    from triton.testing import do_bench

    from medgemma_xray.pytorch_backend.weight_only import (
        quantize_weight,
        triton_gemv,
        triton_weight_only_linear,
    )

    table = {}
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        q = quantize_weight(weight, "int8")
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row = {"bf16_ms": do_bench(lambda: x @ weight.T, return_mode="median")}  # noqa: B023
            row["int8_gemm_ms"] = do_bench(
                lambda: triton_weight_only_linear(x, q.data, q.scale),  # noqa: B023
                return_mode="median",
            )
            if m == 1:
                row["int8_gemv_ms"] = do_bench(lambda: triton_gemv(x, q.data, q.scale), return_mode="median")  # noqa: B023
            row["gemm_error"] = relative(triton_weight_only_linear(x, q.data, q.scale), x @ q.dequantized(x.dtype).T)
            table[f"{name}_m{m}"] = {key: round(value, 5) for key, value in row.items()}
    return table


def exactness(weights: str) -> dict:
    import torch

    from benchmarks import workload
    from benchmarks.random_model import random_medgemma_4b
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
    from medgemma_xray.pytorch_backend.fast import FastTorchInference
    from medgemma_xray.serving.scheduler import Scheduler
    from medgemma_xray.serving.settings import DEMO_MODEL_DIR

    model = random_medgemma_4b(DEMO_MODEL_DIR, "cuda")
    backend = FastTorchInference("random", preloaded=model, slots=16, max_sequence=2048, weights=weights)
    started = time.perf_counter()
    backend.warm_up()
    startup = time.perf_counter() - started
    films = workload.film_variants(2, seed=7)
    requests = [
        GenerationRequest(films[i % 2], (ChatTurn("user", question),), max_new_tokens=64)
        for i, question in enumerate(QUESTIONS)
    ]
    alone = []
    backend.overlaps = False  # the synchronous, host-fed path: one prompt at a time
    for request in requests:
        stats = GenerationStats()
        backend.generate(request, stats)
        alone.append(stats.token_ids)
    backend.overlaps = True
    scheduler = Scheduler(backend, max_active=16, max_waiting=64)
    try:
        together = []
        for _ in range(2):  # the second round reads every prompt's film pages from the prefix cache
            stats = [GenerationStats() for _ in requests]
            tickets = [scheduler.submit(r, s) for r, s in zip(requests, stats, strict=True)]
            for ticket in tickets:
                "".join(ticket.deltas(600, 600))
            together.append([s.token_ids for s in stats])
            shared = [s.prefix_cached_tokens for s in stats]
        profile = scheduler.turn_profile()
    finally:
        scheduler.close(60)
    info = backend.info().details
    backend.close()
    del model
    torch.cuda.empty_cache()
    return {
        "weights": weights,
        "startup_s": round(startup, 1),
        "startup": info.get("startup"),
        "batched_overlapped_equal": sum(a == b for a, b in zip(alone, together[0], strict=True)),
        "prefix_shared_equal": sum(a == b for a, b in zip(alone, together[1], strict=True)),
        "prefix_cached_tokens_second_round": shared,
        "prompts": len(requests),
        "loop_profile": profile,
        "decode_bucket_choices": info.get("decode_bucket_choices"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: kernels, gemm, exactness")
    parser.add_argument("--weights", default="bf16,int8", help="the modes the exactness check runs")
    args = parser.parse_args(argv)
    skip = set(args.skip.split(","))
    record: dict = {}
    if "kernels" not in skip:
        record["kernels"] = kernel_checks()
        print("kernels", json.dumps(record["kernels"]), flush=True)
    if "gemm" not in skip:
        record["gemm"] = gemm_table()
    if "exactness" not in skip:
        record["exactness"] = [exactness(weights) for weights in args.weights.split(",") if weights]
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "paged_checks.json").write_text(json.dumps(record, indent=1, default=str))
    for name, figures in record.get("gemm", {}).items():
        print(f"{name:14s} " + "  ".join(f"{k}={v}" for k, v in figures.items()))
    for row in record.get("exactness", []):
        print(
            f"{row['weights']}: equal alone vs together {row['batched_overlapped_equal']}/{row['prompts']}, "
            f"vs prefix-shared {row['prefix_shared_equal']}/{row['prompts']}; start-up {row['startup_s']} s; "
            f"buckets {row['decode_bucket_choices']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
