"""One answer at the hardware's limit (issue 21): everything measured in one H200 run, a short table last.

  python3 benchmarks/single_stream.py --output $OUT [--budget-s 420]

1. The linears of one decode step at batch 1, timed alone: cuBLAS bf16, the Triton GEMV in bf16 / int8 / fp8, and
   gpt-fast's int8 route (F.linear over int8 weights cast to bf16, times the scales, under torch.compile with
   coordinate-descent tuning: Inductor turns the 1-row product into a reduction with the cast fused in).
2. The decode step at batch 1, captured as a CUDA graph: the current step, the fused step (KV write inside the
   attention kernel) in bf16, int8 and fp8; each one's kernels per step and kernel time (profiler, no graph).
3. The fused step against the current one, token for token (10 prompts x 64 tokens, greedy).
4. int8 and fp8 against bf16: teacher-forced top-1 agreement and KL, 10 prompts x 64 tokens, and conversations
   of >= 1,500 prompt tokens.
5. TTFT split into preprocessing, vision tower, prefill, first decode and the contract's own overhead; 128-token
   answers end to end per mode.
6. The demo checkpoint's phantom macro-F1, bf16 against int8 (engine_build.task_gate), if time is left.
7. (gemv) The one-row GEMV kernels on cold weights: per step matrix, 34 distinct copies (2 of the vocabulary
   matrix) called in one captured CUDA graph, so each call reads weights that are not in L2, as in the step;
   cuBLAS bf16 over the same shapes for comparison; and the configurations the autotuners chose.
Sections run in that order and each is skipped once the time budget is spent; the JSON is written after each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_checks import QUESTIONS, first_divergence  # noqa: E402

SHAPES = {"qkv": (4096, 2560), "o": (2560, 2048), "gate_up": (20480, 2560), "down": (2560, 10240)}
VOCAB = (262208, 2560)
LAYERS = 34


def cuda_ms(fn, repeats: int = 30) -> float:
    """Median of CUDA-event timings of fn() after warm-up."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def linear_table() -> dict:
    """ms per call of each step matrix at batch 1; 4 copies rotated so no timing reads L2-resident weights."""
    import torch
    import torch._inductor.config as inductor

    inductor.coordinate_descent_tuning = True
    gpt_fast = torch.compile(lambda x, w, s: torch.nn.functional.linear(x, w.to(x.dtype)) * s)
    rows = {
        name: _matrix_row(n, k, 2 if name == "lm_head" else 4, gpt_fast)
        for name, (n, k) in {**SHAPES, "lm_head": VOCAB}.items()
    }
    inductor.coordinate_descent_tuning = False
    totals = {}
    for key in ("cublas_bf16", "triton_bf16", "triton_int8", "triton_fp8", "gpt_fast_int8"):
        totals[key] = LAYERS * sum(rows[s][f"{key}_ms"] for s in SHAPES) + rows["lm_head"][f"{key}_ms"]
    return {"per_matrix": rows, "step_linears_ms": totals}


def _matrix_row(n: int, k: int, copies: int, gpt_fast) -> dict:
    import torch

    from pytorch_backend.weight_only import quantize_weight, triton_weight_only_linear

    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q8 = [quantize_weight(w, "int8") for w in weights]
    f8 = [quantize_weight(w, "fp8") for w in weights]
    s8 = [q.scale.to(torch.bfloat16) for q in q8]
    reference = x.float() @ weights[0].float().T
    outputs = {
        "triton_bf16": triton_weight_only_linear(x, weights[0], None),
        "triton_int8": triton_weight_only_linear(x, q8[0].data, q8[0].scale),
        "triton_fp8": triton_weight_only_linear(x, f8[0].data, f8[0].scale),
        "gpt_fast_int8": gpt_fast(x, q8[0].data, s8[0]),
    }
    row = {f"{key}_rel_error": float((v.float() - reference).norm() / reference.norm()) for key, v in outputs.items()}
    variants = {
        "cublas_bf16": lambda i: x @ weights[i].T,
        "triton_bf16": lambda i: triton_weight_only_linear(x, weights[i], None),
        "triton_int8": lambda i: triton_weight_only_linear(x, q8[i].data, q8[i].scale),
        "triton_fp8": lambda i: triton_weight_only_linear(x, f8[i].data, f8[i].scale),
        "gpt_fast_int8": lambda i: gpt_fast(x, q8[i].data, s8[i]),
    }
    for key, call in variants.items():
        row[f"{key}_ms"] = cuda_ms(lambda call=call: [call(i) for i in range(copies)]) / copies
    row["bf16_bytes"] = n * k * 2
    return row


def gemv_table() -> dict:
    """us per call and TB/s of the one-row GEMV per step matrix, each call on a different (cold) copy."""
    import torch

    from pytorch_backend.weight_only import triton_gemv, tuned_configs

    table = {}
    modes = {"qkv": "split", "o": "split", "gate_up": "glu", "down": "split", "lm_head": "plain"}
    for name, (n, k) in {**SHAPES, "lm_head": VOCAB}.items():
        copies = 2 if name == "lm_head" else LAYERS
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        scale = torch.rand(n, device="cuda") * 1e-3 + 1e-4
        row = {}
        for fmt in ("int8", "fp8", "cublas_bf16"):
            if fmt == "int8":
                weights = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(copies)]
            else:
                weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                if fmt == "fp8":
                    weights = [(w * 64).to(torch.float8_e4m3fn) for w in weights]
            if fmt == "cublas_bf16":

                def call(w, x=x):
                    return x @ w.T
            else:

                def call(w, x=x, scale=scale, mode=modes[name]):
                    return triton_gemv(x, w, scale, split=mode == "split", glu=mode == "glu")

            call(weights[0])  # autotune (cold, do_bench flushes L2) outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for w in weights:
                    call(w)
            us = cuda_ms(graph.replay, repeats=10) * 1e3 / copies
            nbytes = n * k * weights[0].element_size()
            row[fmt] = {"us_per_call": round(us, 2), "tb_per_s": round(nbytes / us / 1e6, 2), "mb": nbytes / 1e6}
            del weights, graph
        table[name] = {"mode": modes[name], **row}
    table["tuned"] = tuned_configs()
    return table


def graph_step_ms(step, decoder, repeats: int = 50) -> float:
    import torch

    from pytorch_backend.cuda_graphs import DecodeGraphs

    graphs = DecodeGraphs(step, (1,), decoder.dummy_slot, torch.device("cuda"))
    for _ in range(3):
        graphs.run([100], [300], [0])
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs.run([100], [300], [0])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), graphs


def kernel_profile(step) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    tokens, positions, slots = (torch.tensor([v], device="cuda") for v in (100, 300, 0))
    with torch.inference_mode():
        step(tokens, positions, slots)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(tokens, positions, slots)
            torch.cuda.synchronize()
    events = prof.key_averages()
    top = sorted(events, key=lambda e: e.device_time_total, reverse=True)[:14]
    return {
        "kernels_per_step": sum(e.count for e in events) / 5,
        "kernel_ms_per_step": sum(e.device_time_total for e in events) / 5 / 1e3,
        "top": [
            {"kernel": e.key[:80], "calls": e.count / 5, "ms": round(e.device_time_total / 5 / 1e3, 4)} for e in top
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    parser.add_argument("--long-prompts", type=int, default=2, help="long conversations in the agreement (0: none)")
    args = parser.parse_args()
    began = time.perf_counter()
    import torch
    import triton

    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.recompile_limit = 64
    from inference_api.types import ChatTurn, GenerationRequest, GenerationStats
    from phantoms.films import chest_phantom, png_bytes, quantize
    from pytorch_backend.fast import FastTorchInference
    from pytorch_backend.fused_step import FusedDecodeStep
    from pytorch_backend.weight_gate import teacher_forced_agreements
    from serving.settings import DEMO_MODEL_DIR
    from xray_io import load_radiograph
    from xray_io.preprocess import model_input_image

    args.output.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "command": " ".join(sys.argv),
        "skipped": [],
    }

    def save() -> None:
        results["elapsed_s"] = round(time.perf_counter() - began, 1)
        (args.output / "single_stream.json").write_text(json.dumps(results, indent=2, default=str))

    def left() -> float:
        return args.budget_s - (time.perf_counter() - began)

    wanted = set(filter(None, args.only.split(",")))

    def section(name: str, need_s: float, fn) -> None:
        if wanted and name not in wanted:
            return
        if left() < need_s:
            results["skipped"].append(f"{name} (budget: {left():.0f} s left, needs ~{need_s:.0f})")
            save()
            return
        started = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:  # one section's failure must not lose the others' figures
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        results.setdefault("section_s", {})[name] = round(time.perf_counter() - started, 1)
        save()
        print(f"[{time.perf_counter() - began:6.1f} s] {name} done", flush=True)

    section("linears", 30, linear_table)

    from benchmarks.random_model import random_medgemma_4b

    preloaded = random_medgemma_4b(DEMO_MODEL_DIR, "cuda")
    started = time.perf_counter()
    fast = FastTorchInference(
        "medgemma-4b-random",
        preloaded=preloaded,
        slots=2,
        max_sequence=2048,
        max_resident_conversations=1,
        batch_buckets=(1,),
    )
    fast.warm_up()
    results["startup_s"] = round(time.perf_counter() - started, 1)
    results["startup"] = fast.startup
    save()
    print(f"[{time.perf_counter() - began:6.1f} s] fast path ready", flush=True)
    decoder = fast.decoder
    current_step, current_graphs = fast._step, fast._graphs
    steps = {"current": current_step}
    for weights in () if wanted == {"ttft_ms"} else ("bf16", "int8", "fp8"):
        fused = FusedDecodeStep(decoder, weights, compile=True)
        steps[f"fused_{weights}"] = fused

    def step_table() -> dict:
        table = {}
        for name, step in steps.items():
            call = step if name == "current" else step.decode
            ms, graphs = graph_step_ms(call, decoder)
            table[name] = {"graph_step_ms": ms, "profile": kernel_profile(call)}
            if name != "current":
                table[name]["weight_gb"] = step.weight_bytes / 1e9
                step.graphs = graphs
        return table

    section("steps", 60, step_table)
    from pytorch_backend.weight_only import tuned_configs

    results["tuned"] = tuned_configs()

    films = [
        model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in range(args.prompts)
    ]
    requests = [
        GenerationRequest(film, (ChatTurn("user", q),), max_new_tokens=args.tokens)
        for film, q in zip(films, QUESTIONS, strict=False)
    ]

    def use(graphs) -> None:
        fast._graphs = graphs

    def tokens_of(request) -> list[int]:
        stats = GenerationStats()
        fast.generate(request, stats)
        return stats.token_ids

    def fused_equals_current() -> dict:
        use(current_graphs)
        expected = [tokens_of(r) for r in requests]
        use(steps["fused_bf16"].graphs)
        produced = [tokens_of(r) for r in requests]
        use(current_graphs)
        rows = [first_divergence(a, b) for a, b in zip(expected, produced, strict=True)]
        return {"equal": sum(r is None for r in rows), "prompts": len(rows), "first_divergence": rows}

    section("fused_vs_current", 20, fused_equals_current)

    long_history = []
    for index in range(6):  # about 1,730 prompt tokens with the demo tokenizer
        long_history += [
            ChatTurn("user", QUESTIONS[index % len(QUESTIONS)] + " Please explain in detail. " * 8),
            ChatTurn("assistant", "The film shows clear lungs without focal consolidation. " * 10),
        ]
    long_requests = [
        GenerationRequest(films[i], (*long_history, ChatTurn("user", QUESTIONS[i])), max_new_tokens=args.tokens)
        for i in range(args.long_prompts)
    ]

    def agreement() -> dict:
        reference, formats = steps["fused_bf16"], ("int8", "fp8")
        candidates = [steps[f"fused_{weights}"] for weights in formats]
        short = teacher_forced_agreements(fast, reference, candidates, requests, args.tokens)
        table = {weights: {"short": record.as_dict()} for weights, record in zip(formats, short, strict=True)}
        if long_requests:
            long = teacher_forced_agreements(fast, reference, candidates, long_requests, args.tokens)
            for weights, record in zip(formats, long, strict=True):
                table[weights]["long"] = record.as_dict()
        return table

    section("agreement", 30, agreement)

    ttft_question = QUESTIONS[9] + " Cover the lungs, pleura, heart, mediastinum, bones and any devices." * 6

    def ttft() -> dict:
        """Backend-contract TTFT (start -> images -> prefill until the first token is sampled), then each part
        timed alone with a device sync around it; the rest of the total is the contract's own overhead."""
        use(current_graphs)
        names = ("total", "preprocess", "vision", "prefill", "first_decode")
        parts: dict[str, list[float]] = {k: [] for k in names}
        prompt_tokens = 0
        for repeat in range(7):
            film = films[repeat % len(films)]
            request = GenerationRequest(film, (ChatTurn("user", ttft_question),), max_new_tokens=8)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            generation = fast.start(request)
            fast.prepare_images([generation])
            while not fast.prefill(generation):
                pass
            torch.cuda.synchronize()
            parts["total"].append((time.perf_counter() - t0) * 1e3)
            fast.finish(generation, cancelled=True)
            prompt = fast._encode_impl(request)
            prompt_tokens = len(prompt.ids)
            t0 = time.perf_counter()
            pixels = fast.pixel_values([film])
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            with torch.inference_mode():
                features = fast._vision_one(pixels)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            prompt.features = getattr(features, "pooler_output", features)[0]
            kv = fast._allocate_impl()
            fast._prefill_impl(kv, prompt, 0, len(prompt.ids), True)
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            fast._decode_impl([kv], [100], [len(prompt.ids)])
            t4 = time.perf_counter()
            fast._free_impl(kv)
            for key, value in zip(names[1:], (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                parts[key].append(value * 1e3)
        medians = {key: statistics.median(values[1:]) for key, values in parts.items()}  # the first warms caches
        medians["contract_overhead"] = medians["total"] - sum(medians[k] for k in ("preprocess", "vision", "prefill"))
        medians["prompt_tokens"] = prompt_tokens
        return medians

    section("ttft_ms", 20, ttft)

    def answers() -> dict:
        table = {}
        for name in ("current", "fused_bf16", "fused_int8", "fused_fp8"):
            use(current_graphs if name == "current" else steps[name].graphs)
            times, decode = [], []
            for repeat in range(3):
                request = GenerationRequest(films[repeat], (ChatTurn("user", QUESTIONS[0]),), max_new_tokens=128)
                stats = GenerationStats()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fast.generate(request, stats)
                times.append(time.perf_counter() - t0)
                decode.append(getattr(stats, "decode_ms_per_token", None))
            table[name] = {"answer_128_s": statistics.median(times), "tokens": len(stats.token_ids), "decode": decode}
        use(current_graphs)
        return table

    section("answers", 20, answers)

    def demo_f1() -> dict:
        from engine_build.task_gate import measure_task_accuracy

        demo_bf16 = FastTorchInference(
            DEMO_MODEL_DIR, device="cuda", slots=2, max_sequence=1024, compile=False, cuda_graphs=False
        )
        demo_int8 = FastTorchInference(
            DEMO_MODEL_DIR,
            preloaded=(demo_bf16.model, demo_bf16.processor),
            slots=2,
            max_sequence=1024,
            compile=False,
            cuda_graphs=False,
            weights="int8",
        )
        demo_int8.warm_up()  # the start gate, on the GPU
        record = measure_task_accuracy(demo_bf16, demo_int8, phantoms=24, start_seed=900_000, max_drop=0.01)
        return {
            "gate": demo_int8.startup.get("weight_gate"),
            "task": {k: v for k, v in record.items() if k in ("macro_f1_drop", "passed", "failures")},
            "bf16_macro_f1": record["pytorch"]["macro_f1"],
            "int8_macro_f1": record["bundle"]["macro_f1"],
        }

    section("demo_f1", 40, demo_f1)
    section("gemv", 10, gemv_table)
    results["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    save()

    print("\n| figure | value |\n|---|---|")
    for name, row in (results.get("steps") or {}).items():
        if "graph_step_ms" in row:
            p = row["profile"]
            print(
                f"| step {name} | {row['graph_step_ms']:.3f} ms graph; {p['kernels_per_step']:.0f} kernels, {p['kernel_ms_per_step']:.3f} ms |"
            )
    lin = results.get("linears", {})
    if "step_linears_ms" in lin:
        print(
            f"| step linears alone (ms) | {json.dumps({k: round(v, 3) for k, v in lin['step_linears_ms'].items()})} |"
        )
    for key in ("fused_vs_current", "ttft_ms", "answers", "demo_f1"):
        print(f"| {key} | {json.dumps(results.get(key), default=str)[:600]} |")
    for weights, row in (results.get("agreement") or {}).items():
        if isinstance(row, dict) and "short" in row:
            for kind in [kind for kind in ("short", "long") if kind in row]:
                r = row[kind]
                print(
                    f"| {weights} {kind} | top1 {r['top1_agreement']:.4f} mean KL {r['mean_kl']:.3g} max KL {r['max_kl']:.3g} ({r['tokens']} tokens) |"
                )
    for name, row in (results.get("gemv") or {}).items():
        if isinstance(row, dict) and "int8" in row:
            cells = "; ".join(
                f"{f} {row[f]['us_per_call']} us {row[f]['tb_per_s']} TB/s" for f in ("int8", "fp8", "cublas_bf16")
            )
            print(f"| gemv {name} ({row['mode']}) | {cells} |")
    print(f"| skipped | {results['skipped']} | elapsed {time.perf_counter() - began:.0f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
