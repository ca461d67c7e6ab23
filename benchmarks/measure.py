"""Measurements through the service's streaming path, the same one the UI's handlers use.

Every figure is taken on the client side of InferenceService.stream_answer: time to the first text, the time
between the first and the last, the whole answer. Side by side in one run, on the same inputs, per mode.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks import workload
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats


@dataclass
class Answer:
    ttft_s: float
    total_s: float
    tokens: int
    reused_tokens: int
    admitted_ttft_s: float | None = None  # from the backend's start() to the first token: TTFT less queue wait

    @property
    def decode_ms_per_token(self) -> float | None:
        if self.tokens < 2:
            return None
        return (self.total_s - self.ttft_s) / (self.tokens - 1) * 1e3  # between the first and the last token


def ask(service, request: GenerationRequest) -> tuple[Answer, str]:
    """One answer. Times are those at which the scheduler accepted each token (stats.token_times, the same clock),
    not those of the first visible text: a token can add no text (a random model's ids past the demo
    tokenizer's vocabulary decode to nothing), and the first run measured text, which was wrong."""
    stats = GenerationStats()
    started = time.perf_counter()
    text = ""
    for update in service.stream_answer(request, stats):
        text = update
    ended = time.perf_counter()
    times = stats.token_times
    first = times[0] if times else ended
    last = times[-1] if times else ended
    answer = Answer(first - started, last - started, stats.new_tokens, stats.reused_tokens, stats.first_token_s)
    return answer, text


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "mean": statistics.fmean(ordered),
        "p50": pick(0.5),
        "p99": pick(0.99),
        "p999": pick(0.999),
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def single_stream(service, image, requests: int, max_new_tokens: int, progress: Callable[[], None]) -> dict:
    """One user at a time: TTFT, decode ms/token and the whole answer, over `requests` answers."""
    answers = []
    for _ in range(requests):
        answers.append(ask(service, workload.question_request(image, max_new_tokens))[0])
        progress()
    return {
        "requests": requests,
        "answer_tokens": max_new_tokens,
        "ttft_ms": _scaled(percentiles([a.ttft_s for a in answers]), 1e3),
        "decode_ms_per_token": percentiles(
            [a.decode_ms_per_token for a in answers if a.decode_ms_per_token is not None]
        ),
        "end_to_end_s": percentiles([a.total_s for a in answers]),
        "tokens_per_answer": percentiles([a.tokens for a in answers]),
    }


class GpuBusyProbe:
    """The share of one busy second the GPU spends on the serving backend's launches (prefill, decode, vision),
    from device events around each launch (pytorch_backend/busy_timer.py: a CUDA profile stalled the loop for
    seconds when it stopped). `measure()` runs on the calling thread while the load's threads run: it waits
    delay_s, times window_s, and returns the figures; None where the backend has no timer (CPU, other backends)."""

    def __init__(self, service, delay_s: float = 0.5, window_s: float = 1.0) -> None:
        self.delay_s, self.window_s = delay_s, window_s
        self.timer = getattr(getattr(getattr(service, "_current", None), "backend", None), "busy_timer", None)

    def measure(self) -> dict | None:
        import torch

        if self.timer is None or not torch.cuda.is_available():
            return None
        time.sleep(self.delay_s)
        self.timer.start()
        time.sleep(self.window_s)
        return self.timer.stop()


def concurrency(
    service, image, users: int, answers_each: int, max_new_tokens: int, progress, busy_probe: bool = False
) -> dict:
    """`users` threads asking without pause: aggregate throughput, per-stream speed, TTFT, and failures; with
    busy_probe, the GPU-busy share of one busy second (GpuBusyProbe) and the loop's time split over that run."""
    answers: list[Answer] = []
    failures: list[str] = []
    lock = threading.Lock()

    finished: list[float] = []

    def user() -> None:
        for _ in range(answers_each):
            try:
                answer, _ = ask(service, workload.question_request(image, max_new_tokens))
            except Exception as exc:  # counted and reported: "all served" is a figure, not an assumption
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            with lock:
                answers.append(answer)
            progress()
        with lock:
            finished.append(time.perf_counter())

    loop_before = _turn_profile(service)
    started = time.perf_counter()
    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for thread in threads:
        thread.start()
    busy = GpuBusyProbe(service, delay_s=0.3, window_s=1.0).measure() if busy_probe else None
    for thread in threads:
        thread.join()
    wall = max(finished, default=time.perf_counter()) - started  # the load's own time, not the probe's
    tokens = sum(a.tokens for a in answers)
    extra = {}
    if busy_probe:
        extra["gpu_busy"] = busy
        extra["loop_profile"] = _profile_delta(loop_before, _turn_profile(service))
    return {
        **extra,
        "users": users,
        "answers": len(answers),
        "failures": len(failures),
        "failure_examples": failures[:3],
        "wall_s": wall,
        "requests_per_s": len(answers) / wall,
        "tokens_per_s": tokens / wall,
        "per_stream_ms_per_token": percentiles(
            [a.decode_ms_per_token for a in answers if a.decode_ms_per_token is not None]
        ),
        "ttft_ms": _scaled(percentiles([a.ttft_s for a in answers]), 1e3),
        "ttft_from_admission_ms": _scaled(percentiles(_admitted(answers)), 1e3),
    }


def _turn_profile(service) -> dict | None:
    """The serving scheduler's cumulative loop-time split (Scheduler.turn_profile), where the service has one."""
    scheduler = getattr(getattr(service, "_current", None), "scheduler", None)
    return scheduler.turn_profile() if scheduler is not None else None


def _profile_delta(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    turns = delta.get("turns") or 0
    if turns:
        delta["ms_per_turn"] = {
            key[:-2]: 1e3 * value / turns for key, value in delta.items() if key.endswith("_s") and key != "ms_per_turn"
        }
    return delta


def _admitted(answers: list[Answer]) -> list[float]:
    return [a.admitted_ttft_s for a in answers if a.admitted_ttft_s is not None]


def conversation(service, image, turns: int, max_new_tokens: int, reuse: bool) -> dict:
    """A case over `turns` questions; with reuse the conversation's KV cache stays between turns."""
    conversation_id = uuid.uuid4().hex if reuse else None
    history: tuple[ChatTurn, ...] = ()
    questions = (workload.QUESTION, *workload.FOLLOW_UPS)
    per_turn = []
    started = time.perf_counter()
    for index in range(turns):
        history = (*history, ChatTurn("user", questions[index % len(questions)]))
        request = GenerationRequest(image, history, max_new_tokens, conversation_id=conversation_id)
        answer, text = ask(service, request)
        per_turn.append(answer)
        history = (*history, ChatTurn("assistant", text))
    total = time.perf_counter() - started
    if conversation_id is not None:
        service.forget_conversation(conversation_id)
    follow_ups = per_turn[1:]
    return {
        "turns": turns,
        "kv_reuse": reuse,
        "total_s": total,
        "first_turn_ttft_ms": per_turn[0].ttft_s * 1e3,
        "follow_up_ttft_ms": _scaled(percentiles([a.ttft_s for a in follow_ups]), 1e3),
        "follow_up_reused_tokens": [a.reused_tokens for a in follow_ups],
    }


def film_batch(service, images: list, users: int, report_tokens: int, progress) -> dict:
    """A folder of films: image features (vision batches of 8), then one structured report each, then both."""
    from medgemma_xray.assistant.report_schema import REPORT_PROMPT

    started = time.perf_counter()
    for index in range(0, len(images), 8):
        service.image_features(images[index : index + 8])
        progress()
    features_s = time.perf_counter() - started

    pending = list(images)
    lock = threading.Lock()
    tokens = [0]

    def reporter() -> None:
        while True:
            with lock:
                if not pending:
                    return
                image = pending.pop()
            request = GenerationRequest(image, (ChatTurn("user", REPORT_PROMPT),), report_tokens)
            answer, _ = ask(service, request)
            with lock:
                tokens[0] += answer.tokens
            progress()

    started = time.perf_counter()
    threads = [threading.Thread(target=reporter, daemon=True) for _ in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reports_s = time.perf_counter() - started
    return {
        "films": len(images),
        "report_tokens": report_tokens,
        "concurrent_reports": users,
        "features_s": features_s,
        "reports_s": reports_s,
        "end_to_end_s": features_s + reports_s,
        "films_per_s": len(images) / (features_s + reports_s),
        "report_tokens_per_s": tokens[0] / reports_s,
    }


def _scaled(figures: dict, factor: float) -> dict:
    return {key: (value * factor if key != "n" else value) for key, value in figures.items()}


def _cache_delta(service, before: dict | None) -> dict:
    """Vision-tower calls and cache hit rates over one workload (the backend's counters, after minus before)."""
    after = service.cache_stats() or {}
    before = before or {}

    def delta(cache: str, field: str) -> int:
        return (after.get(cache) or {}).get(field, 0) - (before.get(cache) or {}).get(field, 0)

    image_queries, prefix_queries = delta("mm_cache", "queries"), delta("prefix_cache", "queries")
    return {
        "vision_tower_films": delta("mm_cache", "encoder_calls"),
        "image_cache_queries": image_queries,
        "image_cache_hit_rate": delta("mm_cache", "hits") / image_queries if image_queries else None,
        "prefix_cache_query_tokens": prefix_queries,
        "prefix_cache_hit_rate": delta("prefix_cache", "hits") / prefix_queries if prefix_queries else None,
    }


def _run_students(students: int, spread_s: float, student) -> tuple[float, list[str]]:
    """Start `students` threads at evenly spread times over spread_s seconds; wait for all. (wall s, failures)"""
    failures: list[str] = []
    lock = threading.Lock()

    def run(index: int, start_at: float) -> None:
        time.sleep(max(0.0, start_at - time.perf_counter()))
        try:
            student(index)
        except Exception as exc:  # counted and reported
            with lock:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])

    started = time.perf_counter()
    threads = [
        threading.Thread(target=run, args=(i, started + spread_s * i / max(1, students)), daemon=True)
        for i in range(students)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, failures


def teaching_round(
    service,
    images: list,
    max_new_tokens: int,
    follow_ups: int,
    pause_s: tuple[float, float],
    spread_s: float,
    seed: int = 0,
    busy_probe: bool = False,
) -> dict:
    """Each student has a film (images[i]; the same object for every student: a class on one film) and one case:
    the long first question, then `follow_ups` short ones, pausing a uniformly drawn pause_s = (low, high) seconds
    between an answer and the next question; students arrive evenly spread over spread_s. The pauses are drawn from
    `seed`, so every mode waits the same."""
    import random

    firsts: list[Answer] = []
    laters: list[Answer] = []
    lock = threading.Lock()
    before = service.cache_stats()
    draw = random.Random(seed)
    pauses = [[draw.uniform(*pause_s) for _ in range(follow_ups)] for _ in images]

    def student(index: int) -> None:
        case = uuid.uuid4().hex
        history: list[tuple[str, str]] = []
        questions = [workload.QUESTION, *workload.TEACHING_FOLLOW_UPS[:follow_ups]]
        for turn, question in enumerate(questions):
            if turn:
                time.sleep(pauses[index][turn - 1])
            request = workload.conversation_request(images[index], history, question, max_new_tokens, case)
            answer, text = ask(service, request)
            history.append((question, text))
            with lock:
                (firsts if turn == 0 else laters).append(answer)
        service.forget_conversation(case)

    loop_before = _turn_profile(service)
    outcome: list[tuple[float, list[str]]] = []
    runner = threading.Thread(target=lambda: outcome.append(_run_students(len(images), spread_s, student)))
    runner.start()
    busy = GpuBusyProbe(service, delay_s=spread_s * 0.8, window_s=1.0).measure() if busy_probe else None
    runner.join()
    wall, failures = outcome[0]
    return {
        "gpu_busy": busy,
        "loop_profile": _profile_delta(loop_before, _turn_profile(service)),
        "students": len(images),
        "one_film": len({id(image) for image in images}) == 1,
        "answer_tokens": max_new_tokens,
        "follow_ups": follow_ups,
        "pause_s": list(pause_s),
        "arrivals_spread_s": spread_s,
        "wall_s": wall,
        "failures": len(failures),
        "failure_examples": failures[:3],
        "first_answer_ttft_ms": _scaled(percentiles95([a.ttft_s for a in firsts]), 1e3),
        "follow_up_ttft_ms": _scaled(percentiles95([a.ttft_s for a in laters]), 1e3),
        "follow_up_ttft_from_admission_ms": _scaled(percentiles95(_admitted(laters)), 1e3),
        "follow_up_reused_tokens": percentiles95([a.reused_tokens for a in laters]),
        "per_stream_ms_per_token": percentiles95(
            [a.decode_ms_per_token for a in [*firsts, *laters] if a.decode_ms_per_token is not None]
        ),
        "tokens_per_s": sum(a.tokens for a in [*firsts, *laters]) / wall,
        **_cache_delta(service, before),
    }


def class_on_one_film(service, image, students: int, max_new_tokens: int, spread_s: float) -> dict:
    """Every student asks about the same film (the first questions vary in wording); arrivals spread over
    spread_s. The vision tower should run once, and the film's KV be shared."""
    answers: list[Answer] = []
    lock = threading.Lock()
    before = service.cache_stats()

    def student(index: int) -> None:
        question = workload.CLASS_QUESTIONS[index % len(workload.CLASS_QUESTIONS)]
        answer, _ = ask(service, GenerationRequest(image, (ChatTurn("user", question),), max_new_tokens))
        with lock:
            answers.append(answer)

    wall, failures = _run_students(students, spread_s, student)
    return {
        "students": students,
        "answer_tokens": max_new_tokens,
        "arrivals_spread_s": spread_s,
        "wall_s": wall,
        "failures": len(failures),
        "failure_examples": failures[:3],
        "first_answer_ttft_ms": _scaled(percentiles95([a.ttft_s for a in answers]), 1e3),
        "ttft_from_admission_ms": _scaled(percentiles95(_admitted(answers)), 1e3),
        "per_stream_ms_per_token": percentiles95(
            [a.decode_ms_per_token for a in answers if a.decode_ms_per_token is not None]
        ),
        "tokens_per_s": sum(a.tokens for a in answers) / wall,
        **_cache_delta(service, before),
    }


def percentiles95(values: list[float]) -> dict:
    """percentiles() plus p95, which the teaching-round targets use."""
    figures = percentiles(values)
    if values:
        ordered = sorted(values)
        figures["p95"] = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return figures
