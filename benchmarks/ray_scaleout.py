"""Scale-out on Ray Serve with N replicas, one GPU each, through the ingress's OpenAI API.

    # on a host with N GPUs and the project's ray extra installed (MedGemma-4B shape, random weights, saved once):
    python -m benchmarks.ray_scaleout --replicas 2 --checkpoint /tmp/medgemma-4b-random --output DIR
    # the CPU smoke run (demo checkpoint, two CPU replicas), as on a developer's machine:
    python -m benchmarks.ray_scaleout --replicas 2 --cpu-demo --users-per-replica 2 --answer-tokens 8 --output DIR

It writes a random-weight MedGemma-4B checkpoint once (bf16 on cuda:0, the demo tokenizer and processor; stop tokens
zeroed, so every answer runs to its limit), starts `serve run` on a generated config (deploy/ray/'s application
with `replicas` = N), waits until N replicas report ready on /replicas, and runs three workloads:
- saturated sweep: users-per-replica x N users, each asking new questions back to back: tokens/s in all;
- teaching round: as many conversations of five turns (a film, then workload.FOLLOW_UPS): the share of follow-ups
  answered by the replica that answered the turn before with reused tokens > 0, and first-answer TTFT p95;
- class on one film: as many users asking one question each about the same film, all at once.
TTFT and decode speed are the server's (the ingress clock, medgemma.ttft_s): with a random model most tokens decode
to no text, so a client-side first-text time would be wrong. Replicas share nothing but the ingress; NCCL's and
PyTorch's NVLink multicast variables are left as the machine sets them.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from benchmarks import workload
from benchmarks.measure import percentiles

REPO = Path(__file__).resolve().parents[1]


def write_random_checkpoint(folder: Path) -> None:
    import torch

    from benchmarks.random_model import random_medgemma_4b
    from medgemma_xray.serving.settings import DEMO_MODEL_DIR

    model, processor = random_medgemma_4b(DEMO_MODEL_DIR, "cuda:0")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()


def serve_config(args, port: int) -> dict:
    base = yaml.safe_load((REPO / "deploy/ray/medgemma-cpu-demo.yaml").read_text())
    base["http_options"] = {"host": "127.0.0.1", "port": free_port()}  # Serve's proxy: loopback, none of the app
    users = args.users_per_replica
    app_args = {
        "replicas": args.replicas,
        "max_ongoing_requests": max(64, 4 * users),
        "generation_concurrency": users,
        "queue_size": 1000,
        "max_new_tokens": args.answer_tokens,
        "request_timeout_s": 3600,
        "host": "127.0.0.1",  # the ingress's guarded listener
        "port": port,
    }
    if args.cpu_demo:
        app_args.update(gpus_per_replica=0, cpus_per_replica=0.5, device="cpu")
    else:
        app_args.update(gpus_per_replica=1, cpus_per_replica=4, device="cuda", model_path=str(args.checkpoint))
    base["applications"][0]["args"] = app_args
    return base


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def film_url(seed: int) -> str:
    image = workload.film(seed)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def ask(client, url: str, model: str, messages: list, tokens: int, conversation: str | None = None) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": tokens}
    if conversation is not None:
        body["conversation_id"] = conversation
    started = time.perf_counter()
    reply = client.post(f"{url}/v1/chat/completions", json=body, timeout=3600)
    if reply.status_code != 200:
        raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:300]}")
    answer = reply.json()
    extension = answer["medgemma"]
    return {
        "text": answer["choices"][0]["message"]["content"],
        "tokens": answer["usage"]["completion_tokens"],
        "reused": answer["usage"]["prompt_tokens_details"]["cached_tokens"],
        "replica": extension.get("replica"),
        "conversation_id": extension.get("conversation_id"),  # the server's id, to continue the conversation with
        "ttft_s": extension.get("ttft_s"),
        "decode_ms": extension.get("decode_ms_per_token"),
        "total_s": time.perf_counter() - started,
    }


def in_threads(count: int, work) -> tuple[list, list, float]:
    results, failures, lock = [], [], threading.Lock()

    def run(index: int) -> None:
        try:
            value = work(index)
        except Exception as exc:
            with lock:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        with lock:
            results.append(value)

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, failures, time.perf_counter() - started


def first_message(url: str, question: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
    return {"role": "user", "content": parts}


def run_workloads(client, url: str, model: str, args) -> dict:
    users = args.users_per_replica * args.replicas
    films = [film_url(seed) for seed in range(min(users, 8))]

    def sweep_user(index: int) -> list:
        return [
            ask(
                client,
                url,
                model,
                [first_message(films[index % len(films)], f"{workload.QUESTION} ({index}/{n})")],
                args.answer_tokens,
            )
            for n in range(args.answers_per_user)
        ]

    answers, failures, wall = in_threads(users, sweep_user)
    flat = [a for user in answers for a in user]
    sweep = {
        "users": users,
        "answers": len(flat),
        "failures": failures,
        "tokens_per_s": sum(a["tokens"] for a in flat) / wall,
        "ttft_ms": {k: v * 1e3 for k, v in percentiles([a["ttft_s"] for a in flat]).items() if k != "n"},
        "decode_ms_per_token": percentiles([a["decode_ms"] for a in flat if a["decode_ms"] is not None]),
        "per_replica": {r: sum(a["replica"] == r for a in flat) for r in {a["replica"] for a in flat}},
    }

    def teaching(index: int) -> list:
        messages = [first_message(films[index % len(films)], workload.QUESTION)]
        turns: list[dict] = []
        for follow_up in ("", *workload.FOLLOW_UPS):
            if follow_up:
                messages += [
                    {"role": "assistant", "content": turns[-1]["text"]},
                    {"role": "user", "content": follow_up},
                ]
            conversation = turns[-1]["conversation_id"] if turns else f"round-{index}"
            turns.append(ask(client, url, model, messages, args.turn_tokens, conversation=conversation))
        return turns

    rounds, round_failures, round_wall = in_threads(users, teaching)
    follow_ups = [(t[i - 1], t[i]) for t in rounds for i in range(1, len(t))]
    kept = sum(after["replica"] == before["replica"] and after["reused"] > 0 for before, after in follow_ups)
    round_stats = {
        "conversations": users,
        "failures": round_failures,
        "wall_s": round_wall,
        "follow_ups": len(follow_ups),
        "on_kv_replica_share": kept / len(follow_ups) if follow_ups else None,
        "first_answer_ttft_ms": {
            k: v * 1e3 for k, v in percentiles([t[0]["ttft_s"] for t in rounds]).items() if k != "n"
        },
    }

    one_film = films[0]
    class_answers, class_failures, class_wall = in_threads(
        users,
        lambda i: ask(
            client, url, model, [first_message(one_film, f"{workload.QUESTION} (student {i})")], args.answer_tokens
        ),
    )
    class_stats = {
        "users": users,
        "failures": class_failures,
        "wall_s": class_wall,
        "tokens_per_s": sum(a["tokens"] for a in class_answers) / class_wall,
        "ttft_ms": {k: v * 1e3 for k, v in percentiles([a["ttft_s"] for a in class_answers]).items() if k != "n"},
    }
    return {"saturated_sweep": sweep, "teaching_round": round_stats, "class_on_one_film": class_stats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, required=True, help="model replicas: one GPU each")
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/medgemma-4b-random"))
    parser.add_argument("--cpu-demo", action="store_true", help="the demo checkpoint on CPU replicas (smoke run)")
    parser.add_argument("--users-per-replica", type=int, default=16)
    parser.add_argument("--answers-per-user", type=int, default=4)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--turn-tokens", type=int, default=64)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    import httpx

    if not args.cpu_demo and not (args.checkpoint / "config.json").is_file():
        write_random_checkpoint(args.checkpoint)
    args.output.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = args.output / "serve.yaml"
    config.write_text(yaml.safe_dump(serve_config(args, port), sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "LOG_DIR": str(args.output / "logs")}
    # serve run's own local cluster, as the launcher runs one: Ray's token on, every Ray port on loopback
    env.update(RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    serve = Path(sys.executable).with_name("serve")
    with open(args.output / "serve.log", "wb") as log:
        process = subprocess.Popen(
            [str(serve), "run", str(config)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    record = {"replicas": args.replicas, "cpu_demo": args.cpu_demo, "command": " ".join(sys.argv)}
    try:
        started = time.perf_counter()
        with httpx.Client() as client:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"serve run exited with {process.returncode}; see {args.output / 'serve.log'}")
                try:
                    ready = httpx.get(f"{url}/replicas", timeout=5).json()["ready"]
                except (httpx.HTTPError, ValueError, KeyError):
                    ready = 0
                if ready >= args.replicas:
                    break
                time.sleep(2)
            record["startup_s"] = time.perf_counter() - started
            model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
            record.update(run_workloads(client, url, model, args))
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    (args.output / f"ray_scaleout_{args.replicas}.json").write_text(json.dumps(record, indent=2))
    sweep, rounds = record["saturated_sweep"], record["teaching_round"]
    print("| replicas | users | tokens/s | follow-ups on their KV replica | first-answer TTFT p99 (ms) |")
    print(
        f"| {args.replicas} | {sweep['users']} | {sweep['tokens_per_s']:.0f} | {rounds['on_kv_replica_share']:.1%} "
        f"| {rounds['first_answer_ttft_ms'].get('p99', float('nan')):.0f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
