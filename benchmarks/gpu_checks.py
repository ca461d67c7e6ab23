"""GPU checks of the fast path on the full-size MedGemma-4B shape (random weights), with a short table last.

  python3 -m benchmarks.gpu_checks --output $OUT            # on the GPU host; --device cpu --demo runs it on CPU

1. The decode-attention kernel against the torch reference, in bf16, at the real head shapes.
2. The fast path (compiled, CUDA graphs) against transformers' generate(): greedy tokens over 64 tokens for 10
   prompts; each divergence is shown with generate()'s top-1/top-2 logit margin where it happened.
3. Batched against unbatched: the same 10 prompts decoded in one batch and one at a time.
4. A conversation's follow-up after eviction (re-prefilled) against the same follow-up with the cache kept.
5. The decode step's time, eager vs compiled, each captured as a CUDA graph, at batch 1, 8 and 16, and a profile
   of the compiled step (where the time goes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

QUESTIONS = (
    "What are the main findings on this chest X-ray?",
    "Is there a pneumothorax or pleural effusion?",
    "Describe the heart size and the mediastinum.",
    "Are there any lines, tubes or devices?",
    "Is there consolidation, and in which lobe?",
    "Is this film technically adequate?",
    "What is the most likely diagnosis?",
    "Comment on the costophrenic angles.",
    "Is the trachea central?",
    "Write a structured report with findings and impression.",
)


def first_divergence(expected: list[int], produced: list[int]) -> int | None:
    for index, (a, b) in enumerate(zip(expected, produced, strict=False)):
        if a != b:
            return index
    return None if len(expected) == len(produced) else min(len(expected), len(produced))


def hf_reference(backend, request):
    """generate()'s greedy tokens and, per step, the top-1 minus top-2 logit margin."""
    import torch

    from medgemma_xray.pytorch_backend.hf_reference import hf_inputs

    inputs = hf_inputs(backend, request).to(backend.device, dtype=backend.dtype)
    with torch.inference_mode():
        output = backend.model.generate(
            **inputs,
            max_new_tokens=request.max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = output.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    margins = []
    for step in output.logits:
        top = torch.topk(step[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    return tokens, margins


def kernel_check(device, dtype) -> dict:
    import torch

    from medgemma_xray.pytorch_backend.decode_attention import reference_decode_attention, triton_decode_attention

    torch.manual_seed(0)
    results = {}
    for window in (0, 1024):
        q = torch.randn(16, 8, 256, device=device, dtype=dtype)
        k = torch.randn(20 * 128 + 1, 16, 4, 256, device=device, dtype=dtype)  # pages of 16 positions
        v = torch.randn(20 * 128 + 1, 16, 4, 256, device=device, dtype=dtype)
        tables = torch.randperm(20 * 128, device=device).view(20, 128).to(torch.int32)
        rows = torch.randperm(20, device=device)[:16]
        lengths = torch.randint(1, 2048, (16,), device=device)
        expected = reference_decode_attention(q, k, v, tables, rows, lengths, window, 1 / 16)
        produced = triton_decode_attention(q, k, v, tables, rows, lengths, window, 1 / 16)
        error = ((produced.float() - expected.float()).norm() / expected.float().norm()).item()
        results[f"window_{window}_relative_error"] = error
    return results


def time_steps(step, decoder, batches, repeats: int = 50) -> dict:
    import torch

    from medgemma_xray.pytorch_backend.cuda_graphs import DecodeGraphs

    graphs = DecodeGraphs(decoder, step, batches, torch.device("cuda"))
    figures = {}
    for batch in batches:
        rows = list(range(batch))  # their block tables name the dummy page: timing only
        for _ in range(5):
            graphs.run(rows)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs.run(rows)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        figures[batch] = statistics.median(times)
    return figures


def uncompiled_decode(decoder):
    """The same step with the class's own (uncompiled) layer and sample functions, for the eager-vs-compiled row."""
    import types

    from medgemma_xray.pytorch_backend.paged_decoder import PagedGemmaDecoder

    def decode(tokens, positions, rows):
        saved = decoder.layer_step, decoder.sample
        decoder.layer_step = types.MethodType(PagedGemmaDecoder.layer_step, decoder)
        decoder.sample = types.MethodType(PagedGemmaDecoder.sample, decoder)
        try:
            return PagedGemmaDecoder.decode(decoder, tokens, positions, rows)
        finally:
            decoder.layer_step, decoder.sample = saved

    return decode


def profile_step(step, decoder) -> list:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from medgemma_xray.pytorch_backend.cuda_graphs import DecodeGraphs

    graphs = DecodeGraphs(decoder, step, (1,), torch.device("cuda"))
    graphs.run([0])
    torch.cuda.synchronize()
    # Replay without the graph so the profiler sees each kernel (a replayed graph is one opaque launch).
    tokens = torch.tensor([100], device="cuda")
    positions = torch.tensor([300], device="cuda")
    slots = torch.tensor([0], device="cuda")
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step(tokens, positions, slots)
        torch.cuda.synchronize()
    rows = []
    for event in sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)[:12]:
        rows.append(
            {
                "kernel": event.key[:90],
                "calls_per_step": event.count / 5,
                "ms_per_step": event.device_time_total / 5 / 1e3,
            }
        )
    total = sum(e.device_time_total for e in prof.key_averages()) / 5 / 1e3
    kernels = sum(e.count for e in prof.key_averages()) / 5
    return [{"total_kernel_ms_per_step": total, "kernels_per_step": kernels}, *rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--demo", action="store_true", help="the demo checkpoint instead of the 4B random shape")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--skip-generate", action="store_true", help="skip the comparison with generate()")
    parser.add_argument("--skip-kernel", action="store_true")
    args = parser.parse_args()
    import torch

    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
    from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
    from medgemma_xray.pytorch_backend.eager import TorchInference
    from medgemma_xray.pytorch_backend.fast import FastTorchInference
    from medgemma_xray.serving.settings import DEMO_MODEL_DIR
    from medgemma_xray.xray_io import load_radiograph
    from medgemma_xray.xray_io.preprocess import model_input_image

    args.output.mkdir(parents=True, exist_ok=True)
    results: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}

    def save() -> None:
        (args.output / "gpu_checks.json").write_text(json.dumps(results, indent=2, default=str))

    if args.demo:
        eager = TorchInference(DEMO_MODEL_DIR, device=args.device)
        preloaded = (eager.model, eager.processor)
    else:
        from benchmarks.random_model import random_medgemma_4b

        preloaded = random_medgemma_4b(DEMO_MODEL_DIR, args.device)
        eager = TorchInference("medgemma-4b-random", preloaded=preloaded)
    on_gpu = args.device == "cuda"
    if on_gpu and not args.skip_kernel:
        results["kernel"] = kernel_check(args.device, torch.bfloat16)
        save()
    started = time.perf_counter()
    fast = FastTorchInference(
        "medgemma-4b-random", preloaded=preloaded, slots=16, max_sequence=2048, max_resident_conversations=2
    )
    fast.warm_up()
    results["fast_startup_s"] = time.perf_counter() - started
    results["fast_startup"] = fast.startup
    save()

    films = [
        model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in range(args.prompts)
    ]
    requests = [
        GenerationRequest(film, (ChatTurn("user", q),), max_new_tokens=args.tokens)
        for film, q in zip(films, QUESTIONS, strict=False)
    ]

    def tokens_of(backend, request):
        stats = GenerationStats()
        backend.generate(request, stats)
        return stats.token_ids

    rows = []
    for index, request in enumerate([] if args.skip_generate else requests):
        expected, margins = hf_reference(eager, request)
        produced = tokens_of(fast, request)
        eager_tokens = tokens_of(eager, request)
        divergence = first_divergence(expected, produced)
        rows.append(
            {
                "prompt": index,
                "equal": divergence is None,
                "first_divergence": divergence,
                "generate_margin_there": margins[divergence] if divergence is not None else None,
                "eager_contract_equal_generate": first_divergence(expected, eager_tokens) is None,
            }
        )
    results["fast_vs_generate"] = rows
    save()

    alone = [tokens_of(fast, request) for request in requests]
    generations = [fast.start(request) for request in requests]
    fast.run_together(generations)
    batched_rows = []
    for index, (generation, single) in enumerate(zip(generations, alone, strict=True)):
        fast.finish(generation)
        divergence = first_divergence(single, generation.stats.token_ids)
        batched_rows.append({"prompt": index, "equal": divergence is None, "first_divergence": divergence})
    results["batched_vs_alone"] = batched_rows
    save()

    first = GenerationRequest(films[0], (ChatTurn("user", QUESTIONS[0]),), 32, conversation_id="kept")
    answer = fast.generate(first)
    turns = (*first.turns, ChatTurn("assistant", answer), ChatTurn("user", QUESTIONS[2]))
    kept_stats, evicted_stats = GenerationStats(), GenerationStats()
    fast.generate(GenerationRequest(films[0], turns, 32, conversation_id="kept"), kept_stats)
    fast.forget("kept")
    fast.generate(GenerationRequest(films[0], turns, 32, conversation_id="kept"), evicted_stats)
    results["eviction"] = {
        "reused_with_cache": kept_stats.reused_tokens,
        "reused_after_eviction": evicted_stats.reused_tokens,
        "equal": kept_stats.token_ids == evicted_stats.token_ids,
        "first_divergence": first_divergence(kept_stats.token_ids, evicted_stats.token_ids),
    }
    save()

    if on_gpu:
        decoder = fast.decoder
        results["step_ms_compiled_graph"] = time_steps(fast._step, decoder, (1, 8, 16))
        results["step_ms_eager_graph"] = time_steps(uncompiled_decode(decoder), decoder, (1, 8, 16))
        results["profile_compiled_step"] = profile_step(fast._step, decoder)
        results["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
        save()

    equal = sum(row["equal"] for row in results["fast_vs_generate"])
    batched_equal = sum(row["equal"] for row in results["batched_vs_alone"])
    print("\n| check | result |\n|---|---|")
    if "kernel" in results:
        print(f"| decode kernel vs reference (bf16, rel. error) | {results['kernel']} |")
    if rows:
        print(f"| fast path = generate(), {args.tokens} tokens | {equal}/{len(rows)} prompts |")
    for row in results["fast_vs_generate"]:
        if not row["equal"]:
            print(
                f"| divergence | prompt {row['prompt']} at token {row['first_divergence']}, "
                f"generate() margin {row['generate_margin_there']:.4f} |"
            )
    if rows:
        print(f"| eager contract = generate() | {sum(r['eager_contract_equal_generate'] for r in rows)}/{len(rows)} |")
    print(f"| batched = alone | {batched_equal}/{len(batched_rows)} prompts |")
    print(f"| follow-up after eviction = with cache | {results['eviction']} |")
    print(f"| fast start-up (compile + capture) | {results['fast_startup_s']:.1f} s {results['fast_startup']} |")
    if on_gpu:
        print(f"| step ms, compiled + graph | {results['step_ms_compiled_graph']} |")
        print(f"| step ms, eager + graph | {results['step_ms_eager_graph']} |")
        print(f"| compiled step profile | {results['profile_compiled_step'][0]} |")
        for row in results["profile_compiled_step"][1:8]:
            print(f"| {row['kernel']} | {row['ms_per_step']:.3f} ms, {row['calls_per_step']:.0f} calls |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
