"""Batched prefill and shared caches on the GPU, in one process: equality checks of batched, prefix-shared and cached answers against lone
ones, then the many-user workloads through the service's streaming path, with a short table last.

  python3 -m benchmarks.h200_batching --output $OUT      # on the GPU host (MedGemma-4B shape, random weights)
  python3 -m benchmarks.h200_batching --output OUT --device cpu --demo --quick    # the same code on the demo model

1. Equality, 10 prompts x 64 tokens, greedy ids against the lone answer (caches off, one prompt at a time):
   - batched: the 10 prompts prefilled in one packed forward and decoded in one batch (caches off);
   - cached: each prompt alone after another question about its film (image cache and prefix KV shared);
   - batched + cached: the 10 together again, caches on;
   - two films, one question: each answer equals its lone answer, shares no KV, and the two differ.
2. Workloads: one user (new film each answer), 16 and 64 users without pause (one film and question, as the
   baseline; and 16 users on their own films), a teaching round (48 students, own film, long first question and
   3 follow-ups, 1 s pauses, arrivals over 4 s), a class of 48 on one film, 100 films with a 128-token report each.
3. A profile of about one busy second at 16 users (top kernels and CPU ops).
Each phase is timed and guarded: a failure or the time limit skips the rest, and what ran is kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import time
from pathlib import Path

from benchmarks.gpu_checks import QUESTIONS  # the same 10 prompts as the equality checks


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--demo", action="store_true", help="the demo checkpoint instead of the 4B random shape")
    parser.add_argument("--quick", action="store_true", help="small counts (a CPU smoke run)")
    parser.add_argument("--time-limit-s", type=float, default=480, help="skip phases that would start later")
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="the second run: the many-user phases again with the loop's own profile per phase, 100 films with 64 "
        "reporters, and the same phases with a shorter GIL switch interval (A/B)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated phases to run (e.g. teaching_round,users_16_one_film); default: all",
    )
    return parser.parse_args(argv)


class Run:
    def __init__(self, args) -> None:
        self.args, self.started = args, time.perf_counter()
        self.result: dict = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python3", "benchmarks/h200_batching.py", *sys.argv[1:]]),
            "phases": {},
        }
        args.output.mkdir(parents=True, exist_ok=True)

    def phase(self, name: str, function, *arguments):
        wanted = [part.strip() for part in self.args.only.split(",") if part.strip()]
        if wanted and name not in wanted:
            return None
        left = self.args.time_limit_s - (time.perf_counter() - self.started)
        if left <= 0:
            self.result["phases"][name] = {"skipped": "time limit"}
            return None
        began = time.perf_counter()
        try:
            value = function(*arguments)
        except Exception as exc:
            logging.exception("phase %s failed", name)
            value = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        if isinstance(value, dict):
            value["phase_s"] = round(time.perf_counter() - began, 2)
        self.result["phases"][name] = value
        self.save()
        print(f"[{time.perf_counter() - self.started:6.1f} s] {name}: {json.dumps(value)[:600]}", flush=True)
        return value

    def save(self) -> None:
        (self.args.output / "h200_batching.json").write_text(json.dumps(self.result, indent=1, default=str))


def make_service(args):
    from medgemma_xray.pytorch_backend.fast import FastTorchInference
    from medgemma_xray.serving.service import InferenceService
    from medgemma_xray.serving.settings import DEMO_MODEL_DIR, Settings

    settings = Settings(
        device=args.device,
        generation_concurrency=64 if not args.quick else 4,
        queue_size=10_000,
        max_resident_conversations=48 if not args.quick else 4,
        max_sequence=2048 if not args.quick else 1024,
        request_timeout_s=3600,
        breaker_timeout_s=3600,
        max_new_tokens=128,
        prefix_cache_gib=4.0 if not args.quick else 0.1,
        image_cache_gib=1.0,
    )

    def factory(_mode, _settings):
        if args.demo:
            return FastTorchInference(
                DEMO_MODEL_DIR,
                device=args.device,
                slots=settings.kv_slots,
                max_sequence=settings.max_sequence,
                max_resident_conversations=settings.max_resident_conversations,
                prefix_cache_gib=settings.prefix_cache_gib,
                image_cache_gib=settings.image_cache_gib,
            )
        from benchmarks.random_model import random_medgemma_4b

        return FastTorchInference(
            "MedGemma-4B shape, random weights",
            slots=settings.kv_slots,
            max_sequence=settings.max_sequence,
            max_resident_conversations=settings.max_resident_conversations,
            preloaded=random_medgemma_4b(DEMO_MODEL_DIR, args.device),
            prefix_cache_gib=settings.prefix_cache_gib,
            image_cache_gib=settings.image_cache_gib,
        )

    service = InferenceService(settings, factory)
    service.start()
    return service


# --- 1. equality ----------------------------------------------------------------------------------------------
def _caches(backend, on: bool, saved: dict) -> None:
    """Turn the shared caches off (lone reference) or back on, keeping the pool and capacities."""
    from medgemma_xray.inference_api.shared_caches import ImageFeatureCache, PrefixBlockCache

    if not on:
        saved["prefix"], saved["image"] = backend.prefix_cache, backend.image_cache
        backend.prefix_cache = PrefixBlockCache(0, saved["prefix"].block_tokens)
        backend.image_cache = ImageFeatureCache(0, saved["image"]._size_of)
    else:
        backend.prefix_cache, backend.image_cache = saved["prefix"], saved["image"]


def _together(backend, requests) -> list[list[int]]:
    generations = []
    try:
        for request in requests:
            generations.append(backend.start(request))
        backend.prepare_images(generations)
        while not all(backend.prefill_batch(generations)):
            pass
        while not all(g.done for g in generations):
            backend.step(generations)
    finally:
        for generation in generations:
            backend.finish(generation)
    return [g.stats.token_ids for g in generations]


def _alone(backend, request) -> list[int]:
    from medgemma_xray.inference_api.types import GenerationStats

    stats = GenerationStats()
    backend.generate(request, stats)
    return stats.token_ids, stats


def _compare(expected, produced) -> dict:
    equal = [a == b for a, b in zip(expected, produced, strict=True)]
    divergences = []
    for index, (a, b) in enumerate(zip(expected, produced, strict=True)):
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            divergences.append({"prompt": index, "first_divergence": first})
    return {"equal": f"{sum(equal)}/{len(equal)}", "divergences": divergences}


def equality(service, films, tokens: int, prompts: int) -> dict:
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest

    backend = service._current.backend
    requests = [
        GenerationRequest(films[i % 3], (ChatTurn("user", question),), tokens)
        for i, question in enumerate(QUESTIONS[:prompts])
    ]
    saved: dict = {}
    _caches(backend, False, saved)
    try:
        lone = [_alone(backend, request)[0] for request in requests]
        batched = _together(backend, requests)
    finally:
        _caches(backend, True, saved)
    warm = [GenerationRequest(film, (ChatTurn("user", "Warm the caches for this film."),), 4) for film in films[:3]]
    for request in warm:
        _alone(backend, request)
    cached, prefix_tokens = [], []
    for request in requests:
        ids, stats = _alone(backend, request)
        cached.append(ids)
        prefix_tokens.append(stats.prefix_cached_tokens)
    batched_cached = _together(backend, requests)
    # Two films, one question: lone each (caches off), then with caches on, film 4 after film 3.
    question = "Describe this film in detail."
    pair = [GenerationRequest(film, (ChatTurn("user", question),), tokens) for film in films[3:5]]
    _caches(backend, False, saved)
    try:
        pair_lone = [_alone(backend, request)[0] for request in pair]
    finally:
        _caches(backend, True, saved)
    pair_shared = [_alone(backend, request) for request in pair]
    return {
        "prompts": len(requests),
        "tokens": tokens,
        "batched_vs_lone": _compare(lone, batched),
        "cached_vs_lone": _compare(lone, cached),
        "cached_prefix_tokens": prefix_tokens,
        "batched_cached_vs_lone": _compare(lone, batched_cached),
        "two_films": {
            "each_equals_its_lone_answer": [ids == ref for (ids, _), ref in zip(pair_shared, pair_lone, strict=True)],
            "second_film_prefix_cached_tokens": pair_shared[1][1].prefix_cached_tokens,
            "answers_differ": pair_shared[0][0] != pair_shared[1][0],
        },
    }


# --- 2. workloads -----------------------------------------------------------------------------------------------
def single_new_films(service, films, answers: int) -> dict:
    from benchmarks import measure, workload

    results = [measure.ask(service, workload.question_request(films[i], 128))[0] for i in range(answers)]
    return {
        "answers": answers,
        "ttft_ms": measure._scaled(measure.percentiles([a.ttft_s for a in results]), 1e3),
        "decode_ms_per_token": measure.percentiles([a.decode_ms_per_token for a in results]),
        "end_to_end_s": measure.percentiles([a.total_s for a in results]),
    }


def users(service, image, count: int) -> dict:
    from benchmarks import measure

    before = service.cache_stats()
    figures = measure.concurrency(service, image, count, 2, 128, lambda: None)
    figures.update(measure._cache_delta(service, before))
    return figures


def users_own_films(service, films, count: int) -> dict:
    """`count` users, each on their own film, 2 answers each without pause."""
    import threading

    from benchmarks import measure, workload

    answers, lock = [], threading.Lock()
    before = service.cache_stats()

    def user(index: int) -> None:
        for _ in range(2):
            answer, _ = measure.ask(service, workload.question_request(films[index], 128))
            with lock:
                answers.append(answer)

    wall, failures = measure._run_students(count, 0.0, user)
    return {
        "users": count,
        "answers": len(answers),
        "failures": len(failures),
        "tokens_per_s": sum(a.tokens for a in answers) / wall,
        "per_stream_ms_per_token": measure.percentiles95([a.decode_ms_per_token for a in answers]),
        "ttft_ms": measure._scaled(measure.percentiles95([a.ttft_s for a in answers]), 1e3),
        **measure._cache_delta(service, before),
    }


def profile_busy_second(service, image, args) -> dict:
    """About one second of 16 users: where the loop's time goes (the scheduler's own turn profile), and the top
    GPU kernels and CPU ops of that second (torch profiler)."""
    import threading

    import torch

    from benchmarks import measure, workload

    stop = threading.Event()

    def user() -> None:
        while not stop.is_set():
            measure.ask(service, workload.question_request(image, 128))

    threads = [threading.Thread(target=user, daemon=True) for _ in range(16)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the batch fills
    scheduler = service._current.scheduler
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    before, began = scheduler.turn_profile(), time.perf_counter()
    with torch.profiler.profile(activities=activities) as profiler:
        time.sleep(1.0)
    window = time.perf_counter() - began
    after = scheduler.turn_profile()
    stop.set()
    for thread in threads:
        thread.join()
    loop = {key: round(after[key] - before[key], 4) for key in after}
    loop["window_s"] = round(window, 4)
    loop["idle_or_waiting_s"] = round(window - sum(loop[k] for k in ("admit_s", "prefill_s", "decode_s", "emit_s")), 4)
    turns = loop["turns"] or 1
    loop["ms_per_turn"] = round(1e3 * window / turns, 3)
    loop["decode_ms_per_turn"] = round(1e3 * loop["decode_s"] / turns, 3)
    table = ""
    try:
        sort = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=18, max_name_column_width=60)
    except Exception as exc:  # the loop profile above is the figure; the kernel table is a bonus
        table = f"profiler table unavailable: {exc}"
    (args.output / "h200_batching_profile.txt").write_text(json.dumps(loop, indent=1) + "\n\n" + table)
    return {"loop": loop, "top": table.splitlines()[:22]}


def with_loop_profile(service, function, *arguments) -> dict:
    """Run a phase and add where the scheduler loop spent that time (its turn profile, after minus before)."""
    scheduler = service._current.scheduler
    before, began = scheduler.turn_profile(), time.perf_counter()
    figures = function(*arguments)
    window = time.perf_counter() - began
    after = scheduler.turn_profile()
    loop = {key: round(after[key] - before[key], 4) for key in after}
    busy = sum(loop[key] for key in ("admit_s", "prefill_s", "decode_s", "emit_s"))
    loop.update(window_s=round(window, 3), idle_s=round(window - busy, 3))
    if loop["turns"]:
        loop["decode_ms_per_turn"] = round(1e3 * loop["decode_s"] / loop["turns"], 3)
        loop["rows_per_turn"] = round(loop["decode_rows"] / loop["turns"], 2)
    figures["loop"] = loop
    return figures


def diagnose(run, service, films) -> None:
    from benchmarks import measure

    for label in ("default", "switch_0.5ms"):
        if label != "default":
            sys.setswitchinterval(0.0005)
        run.phase(f"{label}_users_16", with_loop_profile, service, users, service, films[0], 16)
        run.phase(f"{label}_users_64", with_loop_profile, service, users, service, films[0], 64)
        teaching = films[50:98] if label == "default" else films[2:50]
        run.phase(
            f"{label}_teaching_round",
            with_loop_profile,
            service,
            measure.teaching_round,
            service,
            teaching,
            128,
            3,
            (1.0, 1.0),
            4.0,
        )
    sys.setswitchinterval(0.005)
    fresh = workload_variants(100, seed=2)
    run.phase("films_100_64_reporters", with_loop_profile, service, measure.film_batch, service, fresh, 64, 128, _no)


def workload_variants(count: int, seed: int):
    from benchmarks import workload

    return workload.film_variants(count, seed=seed)


def _no() -> None:
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from benchmarks import measure, workload

    run = Run(args)
    quick = args.quick
    started = time.perf_counter()
    service = make_service(args)
    run.result["startup_s"] = round(time.perf_counter() - started, 1)
    run.result["backend"] = service.info().details
    films = workload.film_variants(60 if quick else 100)
    if args.diagnose:
        try:
            diagnose(run, service, films)
            run.result["cache_stats_end"] = service.cache_stats()
        finally:
            service.close()
            run.save()
        keys = ("ttft_ms", "ttft_from_admission_ms", "first_answer_ttft_ms", "follow_up_ttft_ms")
        keys += ("follow_up_ttft_from_admission_ms", "per_stream_ms_per_token")
        for name, value in run.result["phases"].items():
            short = {
                k: {q: round(v, 1) for q, v in value[k].items() if q in ("p50", "p95", "p99")}
                for k in keys
                if isinstance(value.get(k), dict)
            }
            print(
                name,
                json.dumps(
                    {
                        "tokens_per_s": value.get("tokens_per_s"),
                        "end_to_end_s": value.get("end_to_end_s"),
                        **short,
                        "loop": value.get("loop"),
                    }
                ),
            )
        return 0
    try:
        run.phase("equality", equality, service, films, 8 if quick else 64, 4 if quick else 10)
        run.phase("single_user_new_films", single_new_films, service, films[10:], 2 if quick else 10)
        run.phase("users_16_one_film", users, service, films[0], 4 if quick else 16)
        run.phase("users_64_one_film", users, service, films[0], 4 if quick else 64)
        run.phase("users_16_own_films", users_own_films, service, films[20:], 4 if quick else 16)
        students = 4 if quick else 48
        run.phase(
            "teaching_round",
            measure.teaching_round,
            service,
            films[50 : 50 + students] if not quick else films[:4],
            64 if quick else 128,
            3,
            (1.0, 1.0),
            4.0,
        )
        run.phase("class_on_one_film", measure.class_on_one_film, service, films[-1], students, 128, 2.0)
        fresh = workload.film_variants(6 if quick else 100, seed=1)  # films no phase has seen
        run.phase("films_100", measure.film_batch, service, fresh, 16, 128, lambda: None)
        run.phase("profile_16_users", profile_busy_second, service, films[0], args)
        run.result["cache_stats_end"] = service.cache_stats()
    finally:
        service.close()
        run.save()
    print(summary(run.result))
    return 0


def summary(result: dict) -> str:
    phases = result["phases"]

    def get(name, *path):
        value = phases.get(name) or {}
        for key in path:
            value = (value or {}).get(key) if isinstance(value, dict) else None
        return value

    def fmt(value, digits=1):
        return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))

    rows = [
        (
            "equality batched / cached / batched+cached",
            " / ".join(
                fmt(get("equality", key, "equal"))
                for key in ("batched_vs_lone", "cached_vs_lone", "batched_cached_vs_lone")
            ),
            "10/10 each",
        ),
        (
            "two films: each = lone; prefix shared; differ",
            f"{get('equality', 'two_films', 'each_equals_its_lone_answer')}; "
            f"{get('equality', 'two_films', 'second_film_prefix_cached_tokens')}; {get('equality', 'two_films', 'answers_differ')}",
            "True; 0; True",
        ),
        (
            "1 user: 128-token answer p50 (s), new film",
            fmt(get("single_user_new_films", "end_to_end_s", "p50"), 3),
            "<= 0.55",
        ),
        ("1 user: TTFT p50 (ms), new film", fmt(get("single_user_new_films", "ttft_ms", "p50")), "-"),
        (
            "16 users one film: tokens/s; ms/token p50",
            f"{fmt(get('users_16_one_film', 'tokens_per_s'), 0)}; "
            f"{fmt(get('users_16_one_film', 'per_stream_ms_per_token', 'p50'), 2)}",
            ">= 3000; <= 6",
        ),
        (
            "16 users own films: tokens/s; ms/token p50",
            f"{fmt(get('users_16_own_films', 'tokens_per_s'), 0)}; "
            f"{fmt(get('users_16_own_films', 'per_stream_ms_per_token', 'p50'), 2)}",
            ">= 3000; <= 6",
        ),
        (
            "64 users one film: tokens/s; TTFT p99 (ms)",
            f"{fmt(get('users_64_one_film', 'tokens_per_s'), 0)}; {fmt(get('users_64_one_film', 'ttft_ms', 'p99'), 0)}",
            ">= 5000; <= 1000",
        ),
        (
            "teaching 48: first TTFT p50/p95 (ms)",
            f"{fmt(get('teaching_round', 'first_answer_ttft_ms', 'p50'), 0)} / "
            f"{fmt(get('teaching_round', 'first_answer_ttft_ms', 'p95'), 0)}",
            "p95 <= 300",
        ),
        (
            "teaching 48: follow-up TTFT p50/p95 (ms)",
            f"{fmt(get('teaching_round', 'follow_up_ttft_ms', 'p50'), 0)} / "
            f"{fmt(get('teaching_round', 'follow_up_ttft_ms', 'p95'), 0)}",
            "p95 <= 100",
        ),
        (
            "teaching 48: ms/token p50/p95",
            f"{fmt(get('teaching_round', 'per_stream_ms_per_token', 'p50'), 2)} / "
            f"{fmt(get('teaching_round', 'per_stream_ms_per_token', 'p95'), 2)}",
            "-",
        ),
        (
            "class of 48, one film: vision calls; TTFT p50/p95 (ms)",
            f"{get('class_on_one_film', 'vision_tower_films')}; "
            f"{fmt(get('class_on_one_film', 'first_answer_ttft_ms', 'p50'), 0)} / {fmt(get('class_on_one_film', 'first_answer_ttft_ms', 'p95'), 0)}",
            "1; p95 <= 150",
        ),
        ("100 films, 128-token report each (s)", fmt(get("films_100", "end_to_end_s"), 2), "<= 5"),
    ]
    lines = ["| measure | measured | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
