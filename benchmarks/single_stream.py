"""One answer at the hardware's limit: everything measured in one H200 run, a short table last.

  python3 -m benchmarks.single_stream --output $OUT [--budget-s 420]

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
6. The demo checkpoint's phantom macro-F1, bf16 against int8 (medgemma_xray.engine_build.task_gate), if time is left.
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

from benchmarks.gpu_checks import QUESTIONS, first_divergence
from benchmarks.single_stream_analysis import timeline_gaps

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

    from medgemma_xray.pytorch_backend.weight_only import quantize_weight, triton_weight_only_linear

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

    from medgemma_xray.pytorch_backend.weight_only import triton_gemv, tuned_configs

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


def graph_step_ms(step, decoder, repeats: int = 50):
    import torch

    from medgemma_xray.pytorch_backend.cuda_graphs import DecodeGraphs

    graphs = DecodeGraphs(decoder, step, (1,), torch.device("cuda"))
    for _ in range(3):
        graphs.run([0])
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs.run([0])
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


def replay_timeline(graphs, replays: int = 10) -> dict:
    """Kernel timeline of back-to-back graph replays (no host wait between them): the gaps left are the GPU's own
    launch latency between a step's kernels, and whatever separates one replay from the next."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graphs.run([100], [300], [0])
        torch.cuda.synchronize()
    return timeline_gaps(_trace_kernels(prof))


def _trace_kernels(prof) -> list[tuple[float, float]]:
    """(start_us, duration_us) of every kernel, copy and memset in a profiler's trace."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        prof.export_chrome_trace(handle.name)
        events = json.loads(Path(handle.name).read_text()).get("traceEvents", [])
    wanted = {"kernel", "gpu_memcpy", "gpu_memset"}
    return [(float(e["ts"]), float(e.get("dur", 0))) for e in events if e.get("cat") in wanted and "ts" in e]


def fresh_films(count: int, first_seed: int):
    """Films no cache has seen (new content hashes): each TTFT measure pays for its vision tower."""
    from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
    from medgemma_xray.xray_io import load_radiograph
    from medgemma_xray.xray_io.preprocess import model_input_image

    return [
        model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=first_seed + i), 8))))
        for i in range(count)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument(
        "--only",
        default="steps,fused_vs_current,bucketed_prefill,agreement,ttft_ms,service_ttft,gaps,answers",
        help="comma-separated sections to run (all: also linears, demo_f1, gemv)",
    )
    parser.add_argument("--long-prompts", type=int, default=0, help="long conversations in the agreement (0: none)")
    args = parser.parse_args()
    began = time.perf_counter()
    import torch
    import triton

    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.recompile_limit = 64
    import medgemma_xray.pytorch_backend.weight_only as weight_only
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
    from medgemma_xray.pytorch_backend.fast import FastTorchInference
    from medgemma_xray.pytorch_backend.fused_step import FusedDecodeStep
    from medgemma_xray.pytorch_backend.weight_gate import teacher_forced_agreements
    from medgemma_xray.serving.settings import DEMO_MODEL_DIR

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
    if "all" in wanted:
        wanted = set()

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
            import traceback

            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "trace": traceback.format_exc()[-3000:]}
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
    results["info"] = {k: v for k, v in fast.info().details.items() if k != "startup"}
    save()
    print(f"[{time.perf_counter() - began:6.1f} s] fast path ready {fast.startup}", flush=True)
    decoder = fast.decoder
    current_step, current_graphs = fast._step, fast._graphs
    # name -> (weights, reduce_in_kernel, split_qkv, int8 widened by the 2^23 trick); the unsuffixed 8-bit names
    # are the defaults (what FAST_PATH_WEIGHTS serves)
    variants = {
        "fused_bf16": ("bf16", True, False, True),
        "int8_split_qkv_sum_kernel": ("int8", False, True, True),
        "int8_unsplit_qkv": ("int8", False, False, True),
        "int8_unsplit_qkv_i2f": ("int8", False, False, False),
        "fused_int8": ("int8", True, False, True),
        "fp8_sum_kernel": ("fp8", False, False, True),
        "fused_fp8": ("fp8", True, False, True),
    }
    steps: dict = {"current": current_step}
    magic: dict[str, bool] = {}
    every_variant = not wanted or "steps" in wanted
    defaults_only = bool({"agreement", "answers", "fused_vs_current"} & wanted)
    for name, (weights, reduce, split_qkv, widen) in variants.items():
        if not every_variant and not (defaults_only and name in ("fused_bf16", "fused_int8", "fused_fp8")):
            continue
        steps[name] = FusedDecodeStep(decoder, weights, compile=True, reduce_in_kernel=reduce, split_qkv=split_qkv)
        magic[name] = widen

    def step_table() -> dict:
        table = {}
        for name, step in steps.items():
            weight_only.INT8_WIDEN_BY_MAGIC = magic.get(name, True)
            try:
                call = step if name == "current" else step.decode
                ms, graphs = graph_step_ms(call, decoder)
                table[name] = {
                    "graph_step_ms": ms,
                    "profile": kernel_profile(call),
                    "replay_timeline": replay_timeline(graphs),
                }
                if name != "current":
                    table[name]["weight_gb"] = step.weight_bytes / 1e9
                    step.graphs = graphs
            finally:
                weight_only.INT8_WIDEN_BY_MAGIC = True
            print(f"  step {name}: {ms:.3f} ms", flush=True)
        return table

    section("steps", 60, step_table)
    results["tuned"] = weight_only.tuned_configs()

    films = fresh_films(args.prompts, 0)
    requests = [
        GenerationRequest(film, (ChatTurn("user", q),), max_new_tokens=args.tokens)
        for film, q in zip(films, QUESTIONS, strict=False)
    ]

    def use(graphs) -> None:
        fast._graphs = graphs

    def graphs_of(name: str):
        if name == "current":
            return current_graphs
        step = steps[name]
        if getattr(step, "graphs", None) is None:
            _, step.graphs = graph_step_ms(step.decode, decoder, repeats=3)
        return step.graphs

    def tokens_of(request) -> list[int]:
        stats = GenerationStats()
        fast.generate(request, stats)
        return stats.token_ids

    def fused_equals_current() -> dict:
        use(current_graphs)
        expected = [tokens_of(r) for r in requests]
        use(graphs_of("fused_bf16"))
        produced = [tokens_of(r) for r in requests]
        use(current_graphs)
        rows = [first_divergence(a, b) for a, b in zip(expected, produced, strict=True)]
        return {"equal": sum(r is None for r in rows), "prompts": len(rows), "first_divergence": rows}

    section("fused_vs_current", 20, fused_equals_current)

    def bucketed_prefill() -> dict:
        """The bucketed, captured prefill against the packed one: same first token, same 64 tokens (current step)."""
        use(current_graphs)
        runs = {}
        graphs = fast._prefill_graphs
        for label, prefill in (("packed", None), ("bucketed", graphs)):
            fast._prefill_graphs = prefill
            rows = []
            for request in requests:
                stats = GenerationStats()
                fast.generate(request, stats)
                rows.append((stats.token_ids, stats.token_logprobs[0] if stats.token_logprobs else None))
            runs[label] = rows
        fast._prefill_graphs = graphs
        pairs = list(zip(runs["packed"], runs["bucketed"], strict=True))
        return {
            "prompts": len(pairs),
            "first_token_equal": sum(a[0][:1] == b[0][:1] for a, b in pairs),
            "sequences_equal": sum(a[0] == b[0] for a, b in pairs),
            "first_divergence": [first_divergence(a[0], b[0]) for a, b in pairs],
            "max_first_logprob_diff": max(abs(a[1] - b[1]) for a, b in pairs if a[1] is not None),
            "prompt_tokens": len(fast._encode_impl(requests[0]).ids),
            "buckets": list(graphs.buckets) if graphs else [],
        }

    section("bucketed_prefill", 20, bucketed_prefill)

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
    seeds = iter(range(10_000, 20_000, 37))

    def ttft_request(film, tokens: int = 8):
        return GenerationRequest(film, (ChatTurn("user", ttft_question),), max_new_tokens=tokens)

    def contract_ttft(preprocessed: bool) -> float:
        """start -> images -> prefill until the first token is sampled, on a film no cache has seen."""
        film = fresh_films(1, next(seeds))[0]
        request = ttft_request(film)
        if preprocessed:  # as on arrival of the film (scheduler submit / an upload hook), before the question
            fast.preprocess_film(film)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        generation = fast.start(request)
        fast.prepare_images([generation])
        while not fast.prefill(generation):
            pass
        elapsed = (time.perf_counter() - t0) * 1e3
        fast.finish(generation, cancelled=True)
        return elapsed

    def part_times() -> dict[str, float]:
        """Each part alone, with a device sync around it, on a fresh film."""
        film = fresh_films(1, next(seeds))[0]
        prompt = fast._encode_impl(ttft_request(film))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pixels = fast.pixel_values([film])
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        features = fast._vision(pixels)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        prompt.features = features[0]
        kv = fast._allocate_impl()
        step = fast._prefill_batch_impl([(kv, prompt, 0, len(prompt.ids), True)])[0]
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        fast._decode_impl([kv], [step.token_id], [len(prompt.ids)])
        t4 = time.perf_counter()
        fast._free_impl(kv)
        torch.cuda.synchronize()  # the step queued behind the first decode
        names = ("preprocess", "vision", "prefill", "first_decode")
        return {k: v * 1e3 for k, v in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True)} | {
            "prompt_tokens": len(prompt.ids)
        }

    def contract_parts() -> dict[str, float]:
        """What the contract does around the model in a first token, each timed alone on the host: the film's
        content hash, the chat template and tokenizer. (The prefix pool's copy is gone: pages are shared by
        reference.)"""
        from medgemma_xray.inference_api.shared_caches import image_content_hash

        film = fresh_films(1, next(seeds))[0]
        request = ttft_request(film)
        t0 = time.perf_counter()
        image_content_hash(film)
        t1 = time.perf_counter()
        fast._encode_impl(request)
        t2 = time.perf_counter()
        return {"hash_ms": (t1 - t0) * 1e3, "encode_ms": (t2 - t1) * 1e3}

    def medians(rows: list[dict]) -> dict:
        return {key: statistics.median(row[key] for row in rows[1:]) for key in rows[0]}  # the first warms

    def ttft() -> dict:
        use(current_graphs)
        out: dict = {}
        vision_graph, prefill_graphs = fast._vision_graph, fast._prefill_graphs
        configs = {
            "compiled_tower_packed_prefill": (None, None),  # compiled tower, packed prefill: the 2026-12-01 arrangement
            "vision_graph_only": (vision_graph, None),
            "both_graphs": (vision_graph, prefill_graphs),
        }
        for label, (vision, prefill) in configs.items():
            fast._vision_graph, fast._prefill_graphs = vision, prefill
            out[label] = {
                "parts": medians([part_times() for _ in range(6)]),
                "contract_ms": statistics.median([contract_ttft(False) for _ in range(6)][1:]),
            }
        fast._vision_graph, fast._prefill_graphs = vision_graph, prefill_graphs
        out["contract_parts"] = medians([contract_parts() for _ in range(6)])
        out["both_graphs"]["contract_preprocessed_ms"] = statistics.median([contract_ttft(True) for _ in range(6)][1:])
        return out

    section("ttft_ms", 30, ttft)

    def service_ttft() -> dict:
        """Through serving's InferenceService (scheduler thread, output thread, streaming), the real ask path:
        submit -> the first token accepted, and -> the first text yielded; a film preprocessed on arrival vs not."""
        from medgemma_xray.serving.service import InferenceService
        from medgemma_xray.serving.settings import Settings

        use(current_graphs)
        service = InferenceService(Settings(), backend_factory=lambda mode, settings: fast)
        service.start()
        rows: dict[str, list] = {"cold": [], "preprocessed": []}
        try:
            for repeat in range(12):
                kind = "preprocessed" if repeat % 2 else "cold"
                film = fresh_films(1, next(seeds))[0]
                if kind == "preprocessed":
                    fast.preprocess_film(film)  # what an upload hook does when the film arrives
                stats = GenerationStats()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                first_text = None
                for _ in service.stream_answer(ttft_request(film, tokens=4), stats):
                    if first_text is None:
                        first_text = (time.perf_counter() - t0) * 1e3
                rows[kind].append(
                    {"first_token_ms": (stats.token_times[0] - t0) * 1e3, "first_text_ms": first_text or float("nan")}
                )
        finally:
            service._current.scheduler.close(30)  # the backend stays open for the sections after this one
        return {kind: medians(values) for kind, values in rows.items()} | {
            "profile": service._current.scheduler.turn_profile()
        }

    section("service_ttft", 20, service_ttft)

    def gaps() -> dict:
        """Batch 1, 64 tokens, profiled: GPU idle between steps, through the scheduler (each step queued before the
        host reads the one before) and step by step (each read before the next is queued)."""
        from torch.profiler import ProfilerActivity, profile

        from medgemma_xray.serving.scheduler import Scheduler

        use(current_graphs)
        table = {}
        for label in ("scheduler_overlap", "step_by_step"):
            request = ttft_request(fresh_films(1, next(seeds))[0], tokens=args.tokens)
            request = GenerationRequest(request.image, request.turns, max_new_tokens=args.tokens)
            stats = GenerationStats()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                if label == "scheduler_overlap":
                    scheduler = Scheduler(fast, max_active=1, max_waiting=1)
                    try:
                        "".join(scheduler.submit(request, stats).deltas(600, 600))
                    finally:
                        scheduler.close(60)
                else:
                    fast.generate(request, stats)
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            table[label] = timeline_gaps(_trace_kernels(prof)) | {
                "steps": stats.new_tokens,
                "wall_ms_per_step": wall * 1e3 / max(stats.new_tokens, 1),
            }
        return table

    section("gaps", 20, gaps)

    def answers() -> dict:
        table = {}
        for name in ("current", "fused_bf16", "fused_int8", "fused_fp8"):
            if name not in steps:
                continue
            use(graphs_of(name))
            times = []
            for repeat in range(3):
                request = GenerationRequest(films[repeat], (ChatTurn("user", QUESTIONS[0]),), max_new_tokens=128)
                stats = GenerationStats()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fast.generate(request, stats)
                times.append(time.perf_counter() - t0)
            per_token = [b - a for a, b in zip(stats.token_times, stats.token_times[1:], strict=False)]
            table[name] = {
                "answer_128_s": statistics.median(times),
                "tokens": len(stats.token_ids),
                "first_token_ms": (stats.first_token_s or 0) * 1e3,
                "ms_per_token": statistics.median(per_token) * 1e3 if per_token else None,
            }
        use(current_graphs)
        return table

    section("answers", 20, answers)

    def demo_f1() -> dict:
        """The trained demo checkpoint on the GPU, 24 held-out phantoms x 8 findings through the F1 gate
        (medgemma_xray.engine_build.task_gate): bf16 against each 8-bit mode, with that mode's start gate run first."""
        from medgemma_xray.engine_build.task_gate import measure_task_accuracy

        demo_bf16 = FastTorchInference(
            DEMO_MODEL_DIR, device="cuda", slots=2, max_sequence=1024, compile=False, cuda_graphs=False
        )
        table: dict = {}
        for weights in ("int8", "fp8"):
            demo_8bit = FastTorchInference(
                DEMO_MODEL_DIR,
                preloaded=(demo_bf16.model, demo_bf16.processor),
                slots=2,
                max_sequence=1024,
                compile=False,
                cuda_graphs=False,
                weights=weights,
            )
            demo_8bit.warm_up()  # the start gate, on the GPU
            record = measure_task_accuracy(demo_bf16, demo_8bit, phantoms=24, start_seed=900_000, max_drop=0.01)
            table[weights] = {
                "gate": demo_8bit.startup.get("weight_gate"),
                "task": {k: v for k, v in record.items() if k in ("macro_f1_drop", "passed", "failures")},
                "bf16_macro_f1": record["pytorch"]["macro_f1"],
                "macro_f1": record["bundle"]["macro_f1"],
            }
        return table

    section("demo_f1", 40, demo_f1)
    section("gemv", 10, gemv_table)
    results["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    save()
    print_table(results)
    print(f"| skipped | {results['skipped']} | elapsed {time.perf_counter() - began:.0f} s |")
    return 0


def print_table(results: dict) -> None:
    print("\n| figure | value |\n|---|---|")
    for name, row in (results.get("steps") or {}).items():
        if isinstance(row, dict) and "graph_step_ms" in row:
            p, g = row["profile"], row["replay_timeline"]
            print(
                f"| step {name} | {row['graph_step_ms']:.3f} ms; {p['kernels_per_step']:.0f} kernels "
                f"{p['kernel_ms_per_step']:.3f} ms; replay idle {g['idle_fraction']:.3f} |"
            )
        else:
            print(f"| step {name} | {json.dumps(row)[:400]} |")
    for key in ("fused_vs_current", "bucketed_prefill", "agreement", "answers", "service_ttft", "gaps", "demo_f1"):
        if key in results:
            print(f"| {key} | {json.dumps(results.get(key), default=str)[:700]} |")
    for label, row in (results.get("ttft_ms") or {}).items():
        print(f"| ttft {label} | {json.dumps(row, default=str)[:500]} |")
    for weights, row in (results.get("agreement") or {}).items():
        if isinstance(row, dict) and "short" in row:
            for kind in [kind for kind in ("short", "long") if kind in row]:
                r = row[kind]
                print(
                    f"| {weights} {kind} | top1 {r['top1_agreement']:.4f} mean KL {r['mean_kl']:.3g} "
                    f"max KL {r['max_kl']:.3g} ({r['tokens']} tokens) |"
                )
        else:
            print(f"| agreement {weights} | {json.dumps(row)[:300]} |")


if __name__ == "__main__":
    raise SystemExit(main())
