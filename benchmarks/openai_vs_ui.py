"""The OpenAI-compatible endpoint against the UI's path, through one service and one scheduler.

    python -m benchmarks.openai_vs_ui --random-weights --requests 10 --users 1,16,48 --answers-per-user 4 --output DIR

One InferenceService (pytorch-fast with --random-weights on a GPU: MedGemma-4B's shape; else the demo checkpoint).
- UI path: InferenceService.stream_answer, which the Gradio handlers call (film already loaded, as after upload).
- API path: POST /v1/chat/completions with stream=true over loopback HTTP (uvicorn + FastAPI + medgemma_xray.web.openai,
  in this process), the film as a PNG data: URL each time, as a client sends it (the server decodes it once per
  content and keeps it; SSE frames carry the tokens of up to 20 ms each).
Both are timed on one clock (time.perf_counter in this process) from the client's call: TTFT to the first token
the scheduler accepted, decode ms/token between the first and the last, and the end of the answer as the client
saw it. Token times, not text: a random model's tokens mostly decode to no text with the demo tokenizer.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import threading
import time
from pathlib import Path

from benchmarks import workload
from benchmarks.measure import percentiles
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats


class RecordingService:
    """The service, remembering each answer's stats by its question, so the API client can read its token times."""

    def __init__(self, service) -> None:
        self._service = service
        self.stats: dict[str, GenerationStats] = {}

    def __getattr__(self, name):
        return getattr(self._service, name)

    def stream_answer(self, request, stats=None):
        stats = stats if stats is not None else GenerationStats()
        self.stats[request.turns[-1].text] = stats
        return self._service.stream_answer(request, stats)


def timing(started: float, ended: float, stats: GenerationStats) -> dict:
    times = stats.token_times
    first, last = (times[0], times[-1]) if times else (ended, ended)
    decode = (last - first) / (len(times) - 1) * 1e3 if len(times) > 1 else None
    return {"ttft_s": first - started, "decode_ms": decode, "total_s": ended - started, "tokens": stats.new_tokens}


def ui_answer(service, image, question: str, tokens: int) -> dict:
    stats = GenerationStats()
    started = time.perf_counter()
    for _ in service.stream_answer(GenerationRequest(image, (ChatTurn("user", question),), tokens), stats):
        pass
    return timing(started, time.perf_counter(), stats)


def api_answer(client, url: str, model: str, film_url: str, recorder: RecordingService, question: str, tokens: int):
    body = {
        "model": model,
        "stream": True,
        "max_tokens": tokens,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": film_url}}, {"type": "text", "text": question}],
            }
        ],
    }
    started = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {reply.read()[:300]!r}")
        for line in reply.iter_lines():
            if line.startswith("data: ") and '"error"' in line[:20]:
                raise RuntimeError(line[:300])
            if line == "data: [DONE]":
                break
    return timing(started, time.perf_counter(), recorder.stats.pop(question))


def summary(answers: list[dict], wall_s: float | None = None) -> dict:
    result = {
        "answers": len(answers),
        "ttft_ms": {k: v * 1e3 if k != "n" else v for k, v in percentiles([a["ttft_s"] for a in answers]).items()},
        "decode_ms_per_token": percentiles([a["decode_ms"] for a in answers if a["decode_ms"] is not None]),
        "end_to_end_s": percentiles([a["total_s"] for a in answers]),
    }
    if wall_s is not None:
        result["wall_s"] = wall_s
        result["tokens_per_s"] = sum(a["tokens"] for a in answers) / wall_s
    return result


def concurrent(users: int, answers_each: int, answer) -> dict:
    results, failures, lock = [], [], threading.Lock()

    def user(index: int) -> None:
        for number in range(answers_each):
            try:
                measured = answer(f"{workload.QUESTION} (user {index}, answer {number})")
            except Exception as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            with lock:
                results.append(measured)

    started = time.perf_counter()
    threads = [threading.Thread(target=user, args=(i,)) for i in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    figures = summary(results, time.perf_counter() - started)
    figures.update(users=users, failures=len(failures), failure_examples=failures[:3])
    return figures


def build_service(args):
    from medgemma_xray.serving.service import InferenceService
    from medgemma_xray.serving.settings import DEMO_MODEL_DIR, Settings

    device = "cuda" if args.random_weights else args.device
    settings = Settings(
        device=device,
        generation_concurrency=max(args.users, 1),
        queue_size=10_000,
        max_resident_conversations=4,
        request_timeout_s=7200,
        breaker_timeout_s=7200,
        max_new_tokens=args.answer_tokens,
    )
    if not args.random_weights:
        return InferenceService(settings), "demo checkpoint"
    from benchmarks.random_model import random_medgemma_4b
    from medgemma_xray.pytorch_backend.fast import FastTorchInference

    preloaded = random_medgemma_4b(DEMO_MODEL_DIR, "cuda")

    def factory(_mode, settings):
        return FastTorchInference(
            "MedGemma-4B shape, random weights",
            slots=settings.kv_slots,
            max_sequence=settings.max_sequence,
            max_resident_conversations=settings.max_resident_conversations,
            preloaded=preloaded,
        )

    return InferenceService(settings, factory), "MedGemma-4B shape, random weights (pytorch-fast, bf16)"


class LoopbackServer:
    """uvicorn on 127.0.0.1 in a thread this object owns and joins."""

    def __init__(self, app, port: int) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn")

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random-weights", action="store_true", help="MedGemma-4B's shape on CUDA (pytorch-fast)")
    parser.add_argument("--device", default="cpu", help="for the demo checkpoint")
    parser.add_argument("--requests", type=int, default=10, help="single-user answers per path")
    parser.add_argument("--users", default="16", help="concurrent users, one or more: 16 or 1,16,48")
    parser.add_argument("--answers-per-user", type=int, default=4)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    user_counts = [int(count) for count in str(args.users).split(",")]
    args.users = max(user_counts)

    import httpx
    from fastapi import FastAPI

    from medgemma_xray.web.openai import add_openai_routes
    from medgemma_xray.web.openai.serving_models import served_model_name

    service, model_name = build_service(args)
    started = time.perf_counter()
    service.start()
    startup_s = time.perf_counter() - started
    recorder = RecordingService(service)
    api = FastAPI()
    add_openai_routes(api, recorder, None)
    image = workload.film()
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    film_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    url = f"http://127.0.0.1:{args.port}"
    record: dict = {"model": model_name, "startup_s": startup_s, "answer_tokens": args.answer_tokens}
    try:
        with LoopbackServer(api, args.port), httpx.Client() as client:
            model = served_model_name(service.info())

            def api_path(question: str) -> dict:
                return api_answer(client, url, model, film_url, recorder, question, args.answer_tokens)

            def ui_path(question: str) -> dict:
                return ui_answer(service, image, question, args.answer_tokens)

            for path in (ui_path, api_path):  # warm both once (HTTP connection, first data: URL)
                path("warm-up")
            for name, path in (("ui", ui_path), ("api", api_path)):
                single = [path(f"{workload.QUESTION} (single {n})") for n in range(args.requests)]
                record[f"{name}_single"] = summary(single)
                for users in user_counts:
                    record[f"{name}_{users}_users"] = concurrent(users, args.answers_per_user, path)
    finally:
        service.close()
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "openai_vs_ui.json").write_text(json.dumps(record, indent=2))
    rows = [
        ("TTFT p50 (ms), one user", "ttft_ms", "p50", "single"),
        ("decode p50 (ms/token), one user", "decode_ms_per_token", "p50", "single"),
    ]
    for users in user_counts:
        rows.append((f"TTFT p50 (ms), {users} users", "ttft_ms", "p50", f"{users}_users"))
        rows.append((f"tokens/s, {users} users", "tokens_per_s", None, f"{users}_users"))
    print(f"| figure | UI path | OpenAI API |  ({model_name}, {args.answer_tokens}-token answers)")
    for label, key, stat, group in rows:
        values = []
        for path in ("ui", "api"):
            value = record[f"{path}_{group}"][key]
            values.append(value[stat] if stat else value)
        print(f"| {label} | {values[0]:.2f} | {values[1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
