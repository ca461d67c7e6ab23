"""Benchmark every available mode side by side, in one run, on the same inputs, through the service's streaming path.

  python benchmark.py --output results/                       # the demo checkpoint on this machine (CPU or GPU)
  python benchmark.py --random-weights medgemma-4b --output results/ --requests 100    # full-size shape, on a GPU
  python benchmark.py --engine_path engines/demo-int8 --modes pytorch-eager,trt ...    # include an engine bundle

Modes: pytorch-eager (the transformers reference), pytorch-fast (static KV cache, compiled decode step captured
as CUDA graphs), trt (an engine bundle, where an executor runs). Writes benchmark.json, benchmark.md and
benchmark.png to --output and prints the Markdown table last.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

DEFAULT_MODES = (
    "pytorch-eager",
    "pytorch-fast",
    "trt",
)  # the valid names: medgemma_xray.serving.factory.CONFIGURATIONS
if TYPE_CHECKING:
    from collections.abc import Iterator

    from medgemma_xray.inference_api.types import BackendInfo, GenerationRequest, GenerationStats
    from medgemma_xray.serving.service import InferenceService

logger = logging.getLogger("benchmark")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="folder for benchmark.json / .md / .png")
    from medgemma_xray.serving.factory import CONFIGURATIONS

    parser.add_argument(
        "--modes", default=",".join(DEFAULT_MODES), help="comma-separated, of: " + ", ".join(CONFIGURATIONS)
    )
    parser.add_argument("--random-weights", choices=["medgemma-4b"], help="build the full-size shape on the device")
    parser.add_argument("--model_path", type=Path, help="checkpoint (default: the demo checkpoint)")
    parser.add_argument("--engine_path", type=Path, help="engine bundle for the trt mode")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--requests", type=int, default=100, help="single-user answers per mode")
    parser.add_argument("--eager-requests", type=int, help="for pytorch-eager (slow on purpose); default --requests")
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,4,8,16,32,64", help="user counts for the sweep")
    parser.add_argument("--eager-max-users", type=int, default=4, help="largest sweep level for pytorch-eager")
    parser.add_argument("--answers-per-user", type=int, default=2)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--turn-tokens", type=int, default=64)
    parser.add_argument("--films", type=int, default=100)
    parser.add_argument("--eager-films", type=int, help="films for pytorch-eager; default --films")
    parser.add_argument("--report-tokens", type=int, default=128)
    parser.add_argument("--report-users", type=int, default=16)
    parser.add_argument(
        "--teaching-students",
        default="",
        help="comma-separated class sizes for a teaching round: arrivals spread over 3 s, a long first question "
        "then 3 follow-ups with 0.5-2 s pauses, each student on their own film (empty: off)",
    )
    parser.add_argument(
        "--class-students",
        default="",
        help="comma-separated class sizes for the same round with the whole class on one film (empty: off)",
    )
    parser.add_argument(
        "--busy-users",
        default="16,48",
        help="concurrency levels (and class sizes) whose busy second is profiled for GPU-busy %% (CUDA only)",
    )
    parser.add_argument("--max-sequence", type=int, default=2048, help="static KV cache length of the fast path")
    parser.add_argument(
        "--task-phantoms",
        type=int,
        default=0,
        help="also ask this many held-out labelled phantoms every finding's question: per-finding F1 per mode "
        "(meaningful for the trained demo checkpoint; 0: off)",
    )
    parser.add_argument("--task-seed", type=int, default=900_000, help="first held-out phantom seed for F1")
    parser.add_argument("--restart-probe", action="store_true", help="also time two fresh processes' start-up")
    parser.add_argument("--startup-only", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


class Models:
    """Loads the weights once and hands them to each PyTorch mode (each mode's own start-up is timed apart)."""

    def __init__(self, args) -> None:
        self.args = args
        self._loaded: tuple[Any, Any] | None = None  # (model, processor)
        self.load_s: float | None = None

    @property
    def name(self) -> str:
        return "MedGemma-4B shape, random weights" if self.args.random_weights else str(self.model_path)

    @property
    def model_path(self) -> Path:
        from medgemma_xray.serving.settings import DEMO_MODEL_DIR

        return self.args.model_path or DEMO_MODEL_DIR

    def preloaded(self, device: str):
        if self._loaded is None:
            started = time.perf_counter()
            if self.args.random_weights:
                from benchmarks.random_model import random_medgemma_4b
                from medgemma_xray.serving.settings import DEMO_MODEL_DIR

                self._loaded = random_medgemma_4b(DEMO_MODEL_DIR, device)
            else:
                import torch
                from transformers import AutoModelForImageTextToText, AutoProcessor

                dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
                # transformers wraps PreTrainedModel.to so that its stub reads the device as `self`
                model = AutoModelForImageTextToText.from_pretrained(self.model_path, dtype=dtype)
                model = model.to(device).eval()
                self._loaded = (model, AutoProcessor.from_pretrained(self.model_path))
            self.load_s = time.perf_counter() - started
        return self._loaded


def run_mode(mode: str, models: Models, args, device: str, bar) -> dict:
    from benchmarks import measure, workload
    from medgemma_xray.inference_api.types import Mode
    from medgemma_xray.serving.factory import configure, create_backend
    from medgemma_xray.serving.service import InferenceService
    from medgemma_xray.serving.settings import Settings

    eager = mode == "pytorch-eager"
    levels = [int(x) for x in args.concurrency.split(",") if x]
    if eager:
        levels = [level for level in levels if level <= args.eager_max_users]
    serving_mode, settings = configure(
        mode,
        Settings(
            model_path=Path(models.name),
            device=device,
            engine_path=args.engine_path,
            generation_concurrency=max(
                [*levels, args.report_users, 1]
                + [int(x) for x in f"{args.teaching_students},{args.class_students}".split(",") if x]
            ),
            queue_size=10_000,
            # every student's case stays resident between turns (a follow-up then prefills only its new tokens)
            max_resident_conversations=max(
                [4] + [int(x) for x in f"{args.teaching_students},{args.class_students}".split(",") if x]
            ),
            max_sequence=args.max_sequence,
            request_timeout_s=7200,
            breaker_timeout_s=7200,
            max_new_tokens=max(args.answer_tokens, args.report_tokens),
        ),
    )
    preloaded = models.preloaded(device) if serving_mode is Mode.PYTORCH else None
    _reset_peak_memory()
    started = time.perf_counter()
    service = InferenceService(settings, functools.partial(create_backend, preloaded=preloaded))
    service.start()
    info = _started_info(service)
    record: dict[str, Any] = {"info": {**info.__dict__, "mode": str(info.mode)}}
    startup = dict(info.details.get("startup", {}))
    startup["total_s"] = time.perf_counter() - started
    if models.load_s is not None and mode != "trt":
        startup["weights_load_s (shared, once)"] = models.load_s
    record["startup"] = startup
    image = workload.film()
    try:
        requests = args.eager_requests if eager and args.eager_requests is not None else args.requests
        bar.set_description(f"{mode}: single user")
        record["single_stream"] = measure.single_stream(service, image, requests, args.answer_tokens, bar.update)
        record["concurrency"] = []
        busy = {int(x) for x in args.busy_users.split(",") if x}
        for users in levels:
            bar.set_description(f"{mode}: {users} users")
            record["concurrency"].append(
                measure.concurrency(
                    service,
                    image,
                    users,
                    max(args.answers_per_user, 3) if users in busy else args.answers_per_user,  # a busy second's load
                    args.answer_tokens,
                    bar.update,
                    users in busy,
                )
            )
        bar.set_description(f"{mode}: conversation")
        record["conversation"] = [
            measure.conversation(service, image, args.turns, args.turn_tokens, reuse=reuse) for reuse in (False, True)
        ]
        films = args.eager_films if eager and args.eager_films is not None else args.films
        if films:
            bar.set_description(f"{mode}: {films} films")
            record["film_batch"] = measure.film_batch(
                service, workload.films(films), args.report_users, args.report_tokens, bar.update
            )
        for key, sizes in (("teaching_round", args.teaching_students), ("class_on_one_film", args.class_students)):
            for students in [int(x) for x in sizes.split(",") if x]:
                bar.set_description(f"{mode}: {key} of {students}")
                if key == "teaching_round":
                    images = workload.film_variants(students, seed=3)
                else:
                    images = [workload.film_variants(1, seed=4 + students)[0]] * students
                record.setdefault(key, []).append(
                    measure.teaching_round(
                        service,
                        images,
                        args.answer_tokens,
                        3,
                        (0.5, 2.0),
                        3.0,
                        seed=students,
                        busy_probe=students in busy,
                    )
                )
        if args.task_phantoms:
            bar.set_description(f"{mode}: task accuracy")
            record["task_accuracy"] = task_accuracy(service, args.task_phantoms, args.task_seed)
    finally:
        record["peak_gpu_gib"] = _peak_memory_gib()
        service.close()
    return record


def _started_info(service: InferenceService) -> BackendInfo:
    """The running backend's description; a started service always has one."""
    info = service.info()
    if info is None:
        raise RuntimeError("The inference service started without a backend; see its log for why.")
    return info


def task_accuracy(service: InferenceService, phantoms: int, start_seed: int) -> dict:
    """Per-finding F1, macro-F1 and ECE of this mode through the serving path (the same questions and rule as the
    engine build's F1 gate), so the table compares precisions on answers, not only on speed."""
    from types import SimpleNamespace

    from medgemma_xray.engine_build.task_gate import MAX_NEW_TOKENS
    from medgemma_xray.phantoms.evaluation import held_out_phantoms
    from medgemma_xray.phantoms.evaluation import task_accuracy as measure_task_accuracy

    started = time.perf_counter()

    def stream_generate(request: GenerationRequest, stats: GenerationStats) -> Iterator[str]:
        """The service yields the answer so far; phantom_eval joins pieces, so hand it only the final text."""
        *_, answer = ("", *service.stream_answer(request, stats))
        yield answer

    backend = SimpleNamespace(stream_generate=stream_generate)
    result = measure_task_accuracy(
        backend, held_out_phantoms(phantoms, start_seed), max_new_tokens=MAX_NEW_TOKENS, share_film_prefix=True
    )
    summary = {key: value for key, value in result.items() if key != "answers"}
    summary.update(seeds=[start_seed, start_seed + phantoms - 1], wall_s=time.perf_counter() - started)
    return summary


def machine(device: str) -> dict:
    import torch

    record = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cpu",
    }
    if device.startswith("cuda"):
        record["device"] = torch.cuda.get_device_name()
        record["cuda"] = torch.version.cuda
    import transformers

    record["transformers"] = transformers.__version__
    return record


def restart_probe(args) -> list[dict]:
    """Two fresh processes with one inductor cache folder: the first compiles cold, the second reads the cache."""
    cache = args.output / "inductor-cache"
    runs = []
    for attempt in ("cold", "with compile cache"):
        command = [
            sys.executable,
            __file__,
            "--startup-only",
            "--output",
            str(args.output),
            "--device",
            args.device,
            "--max-sequence",
            str(args.max_sequence),
            "--concurrency",
            args.concurrency,
        ]
        if args.random_weights:
            command += ["--random-weights", args.random_weights]
        if args.model_path:
            command += ["--model_path", str(args.model_path)]
        environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=1800)
        line = next((x for x in result.stdout.splitlines() if x.startswith("STARTUP ")), None)
        runs.append(
            {
                "run": attempt,
                "process_s": time.perf_counter() - started,
                **(json.loads(line[8:]) if line else {"error": result.stderr[-500:]}),
            }
        )
    return runs


def startup_only(args, device: str) -> None:
    from medgemma_xray.serving.factory import configure, create_backend
    from medgemma_xray.serving.service import InferenceService
    from medgemma_xray.serving.settings import Settings

    models = Models(args)
    levels = [int(x) for x in args.concurrency.split(",") if x]
    _, settings = configure(
        "pytorch-fast",
        Settings(
            model_path=Path(models.name),
            device=device,
            generation_concurrency=max(levels),
            max_sequence=args.max_sequence,
        ),
    )
    started = time.perf_counter()
    preloaded = models.preloaded(device)
    service = InferenceService(settings, functools.partial(create_backend, preloaded=preloaded))
    service.start()
    startup = {
        **_started_info(service).details.get("startup", {}),
        "service_start_s": time.perf_counter() - started,
        "weights_s": models.load_s,
    }
    service.close()
    print("STARTUP " + json.dumps(startup))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    from tqdm import tqdm

    from benchmarks import report

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if args.startup_only:
        startup_only(args, device)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    from medgemma_xray.serving.factory import CONFIGURATIONS

    unknown = sorted(set(modes) - set(CONFIGURATIONS))
    if unknown:
        print(f"error: unknown mode(s) {', '.join(unknown)}; valid: {', '.join(CONFIGURATIONS)}", file=sys.stderr)
        return 2
    models = Models(args)
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(part) for part in ["python", *sys.argv]),
        "machine": machine(device),
        "model": models.name,
        "settings": {key: str(value) for key, value in vars(args).items()},
        "modes": {},
    }
    with tqdm(desc="benchmark", unit="answer", file=sys.stderr) as bar:
        for mode in modes:
            if mode == "trt" and args.engine_path is None:
                result["modes"][mode] = {"error": "no --engine_path given"}
                continue
            try:
                result["modes"][mode] = run_mode(mode, models, args, device, bar)
            except Exception as exc:  # one mode failing must not lose the others' figures
                logger.exception("mode %s failed", mode)
                result["modes"][mode] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            report.write(result, args.output)  # partial results survive a later failure or timeout
    if args.restart_probe:
        result["restart_probe"] = restart_probe(args)
    paths = report.write(result, args.output)
    print(paths["markdown"].read_text())
    if result.get("restart_probe"):
        print("start-up of a fresh process:", json.dumps(result["restart_probe"]))
    return 0


def _reset_peak_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_memory_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**30


if __name__ == "__main__":
    raise SystemExit(main())
