"""The engine path's decode step on CPU (ONNX Runtime) for 1, 2, 4 and 8 sequences, two bundles side by side.

  python -m benchmarks.onnx_batched_decode --bundle engines/demo-fp32 --output results/ \
      --baseline-bundle /tmp/old/demo-fp32 --baseline-src /tmp/old-checkout/src

Each bundle runs in its own worker process with its own source tree (a format-1 bundle only opens with the code
that made it, and this tree refuses it): --bundle with this tree, --baseline-bundle (optional) with
--baseline-src. The parent asks the workers in turn, one sequence count at a time, so both see the same shared
machine at nearly the same moments. A step is what serving runs: one sequence alone (`sequence.run`), several in
one batched call (`decode_batch`); every sequence advances one token. The sequences first prefill different
questions on different films, so their pasts differ in length, as in serving, then take --warmup steps (the batch
forms: its one copy of every past) before --steps timed ones. Figures per count: the fastest step, the median
and the median process CPU time, in ms, each the lowest over --rounds rounds (a shared 2-core machine disturbs
wall time; the least disturbed round is the closest to the work itself; every round is recorded), and their
ratios to one sequence (add_ratios). ONNX Runtime takes its threads as serving does (OMP_NUM_THREADS, else the
cores this process may use). Writes onnx_batched_decode.json and prints a table last; --profile DIR also writes ONNX Runtime's
profiles of --bundle's 1- and 8-sequence steps there and sums their kernel time by operator type.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

QUESTIONS = (
    "Findings?",
    "Is the heart enlarged?",
    "Any pleural effusion?",
    "Is there a pneumothorax on the right?",
    "Describe the lungs.",
    "Is there a nodule or mass?",
    "Any consolidation in the lower lobes?",
    "Are the lines and tubes in place?",
)
COUNTS = (1, 2, 4, 8)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--baseline-bundle", type=Path, help="a bundle to measure beside --bundle (e.g. format 1)")
    parser.add_argument("--baseline-src", type=Path, help="the source tree (its src/ folder) that opens it")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="each count measured this many times, in turn")
    parser.add_argument("--profile", type=Path, help="write ONNX Runtime's profile of --bundle's 8-sequence steps here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args.bundle, args.profile)
    if args.baseline_bundle and not args.baseline_src:
        parser.error("--baseline-bundle needs --baseline-src: the source tree that opens it")

    here = Path(__file__).resolve().parents[1]
    runs = {"this tree": (args.bundle, here / "src")}
    if args.baseline_bundle:
        runs["baseline"] = (args.baseline_bundle, args.baseline_src)
    workers = {label: _Worker(bundle, src, here, None) for label, (bundle, src) in runs.items()}
    figures: dict[str, dict[int, dict]] = {label: {} for label in runs}
    try:
        for _ in range(args.rounds):
            for count in COUNTS:
                for label, worker in workers.items():
                    row = worker.ask({"count": count, "steps": args.steps, "warmup": args.warmup})
                    best = figures[label].setdefault(count, {**row, "rounds": []})
                    best["rounds"].append(row)
                    for key in ("fastest", "median", "cpu_median"):  # each the least disturbed of the rounds
                        best[key] = min(best[key], row[key])
        profiles: dict[str, dict] = {}
        for label, (bundle, src) in runs.items() if args.profile else ():
            folder = args.profile / label.replace(" ", "-")
            folder.mkdir(parents=True, exist_ok=True)
            profiler = _Worker(bundle, src, here, folder)
            try:
                for count in (1, 8):
                    request = {"count": count, "steps": args.steps, "warmup": args.warmup, "profile": True}
                    profiles.setdefault(label, {})[count] = profiler.ask(request)["profile"]
            finally:
                profiler.close()
    finally:
        for worker in workers.values():
            worker.close()

    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.onnx_batched_decode", *sys.argv[1:]]),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average": os.getloadavg(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "bundles": {label: {"bundle": str(bundle), "src": str(src)} for label, (bundle, src) in runs.items()},
        "ms_per_step": figures,
        "target": "N sequences in one step under 2x one sequence",
    }
    add_ratios(result)
    if profiles:
        result["profile"] = profiles
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "onnx_batched_decode.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    for label, profile in profiles.items():
        print(f"\nONNX Runtime's kernel time per step, {label}:\n{profile_table(profile)}")
    return 0


def profile_table(profiles: dict) -> str:
    """ONNX Runtime's kernel time per decode step by operator type, 1 sequence against 8 (medians per node)."""
    one, eight = profiles[1]["us_by_op"], profiles[8]["us_by_op"]
    lines = ["| operator | 1 sequence, us/step | 8 sequences, us/step | 8 / 1 |", "|---|---|---|---|"]
    for op in sorted(eight, key=lambda name: one.get(name, 0) - eight[name])[:8]:
        lines.append(f"| {op} | {one.get(op, 0):.0f} | {eight[op]:.0f} | {eight[op] / max(one.get(op, 0), 1):.1f}x |")
    total = [sum(p["us_by_op"].values()) for p in (profiles[1], profiles[8])]
    lines.append(f"| all kernels | {total[0]:.0f} | {total[1]:.0f} | {total[1] / total[0]:.1f}x |")
    return "\n".join(lines)


def add_ratios(result: dict) -> None:
    """Each count's figures over one sequence's, two ways. ratio_to_one: the lowest of the rounds over the lowest,
    each count at its least disturbed moment (the estimate of the work itself; what the table's ratios are).
    ratio_same_round: within each round, then the median over the rounds; on a loaded machine it runs low,
    because load stretches the short one-sequence step more than the longer batched ones, so it is recorded
    beside, not instead."""
    keys = ("fastest", "median", "cpu_median")
    result["ratio_to_one"], result["ratio_same_round"] = {}, {}
    for label, rows in result["ms_per_step"].items():
        one = rows[1] if 1 in rows else rows["1"]
        result["ratio_to_one"][label] = {count: {k: row[k] / one[k] for k in keys} for count, row in rows.items()}
        result["ratio_same_round"][label] = {
            count: {
                k: statistics.median(r[k] / r1[k] for r, r1 in zip(row["rounds"], one["rounds"], strict=True))
                for k in keys
            }
            for count, row in rows.items()
        }


def table(result: dict) -> str:
    lines = [
        "| bundle | sequences | fastest ms | median ms | CPU median ms | fastest / one | median / one | CPU / one "
        "| fastest / one, same round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, rows in result["ms_per_step"].items():
        for count, row in rows.items():
            ratio, same = result["ratio_to_one"][label][count], result["ratio_same_round"][label][count]
            lines.append(
                f"| {label} | {count} | {row['fastest']:.2f} | {row['median']:.2f} | {row['cpu_median']:.2f} | "
                f"{ratio['fastest']:.2f}x | {ratio['median']:.2f}x | {ratio['cpu_median']:.2f}x | "
                f"{same['fastest']:.2f}x |"
            )
    return "\n".join(lines)


class _Worker:
    """A child process serving one bundle with one source tree; asked one JSON line at a time."""

    def __init__(self, bundle: Path, src: Path, repo: Path, profile: Path | None) -> None:
        command = [sys.executable, "-m", "benchmarks.onnx_batched_decode", "--worker", "--bundle", str(bundle)]
        command += ["--output", "unused"] + (["--profile", str(profile)] if profile else [])
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(repo)])}
        self.process = subprocess.Popen(
            command, cwd=repo, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, request: dict) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker for {request} ended (exit {self.process.wait()}); its errors are above")
        return json.loads(line)

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _worker(bundle: Path, profile: Path | None) -> int:
    """Answer {"count", "steps", "warmup"} lines on stdin with one figures line each on stdout."""
    from medgemma_xray.trt_inference.trt_model import TRTInference

    engine = TRTInference(bundle, executor="onnxruntime-cpu", sequence_slots=max(COUNTS))
    try:
        for line in sys.stdin:
            request = json.loads(line)
            if request.get("profile") and profile:
                plain = _profile_decoder(engine, bundle, profile / f"decoder-{request['count']}")
            row = _measure(engine, request["count"], request["steps"], request["warmup"])
            if request.get("profile") and profile:
                trace = engine.executor.sessions["decoder"].end_profiling()
                engine.executor.sessions["decoder"], engine.executor._bindings = plain, {}
                row["profile"] = _summarise_profile(Path(trace), request["steps"])
            print(json.dumps(row), flush=True)
    finally:
        engine.close()
    return 0


def _profile_decoder(engine, bundle: Path, prefix: Path):
    """Swap in a decoder session with ONNX Runtime's profiler on (same options otherwise); returns the plain one.
    The executor's IO bindings belong to a session, so they are dropped and made again on the next run."""
    import onnxruntime as ort

    executor = engine.executor
    plain = executor.sessions["decoder"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = plain.get_session_options().intra_op_num_threads
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, executor.optimization_level)
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    onnx_file = bundle / engine.manifest["graphs"]["decoder"]["onnx"]
    executor.sessions["decoder"] = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    executor._bindings = {}
    return plain


def _summarise_profile(trace: Path, steps: int) -> dict:
    """Kernel time per decode step: the median of each node over the last `steps` runs (the timed steps; the
    prefills and warm-up come first), summed by operator type. The profiler's own cost per node is in these
    figures, the same at every batch size."""
    events = json.loads(trace.read_text())
    runs = [event for event in events if event.get("name") == "model_run"][-steps:]
    start = runs[0]["ts"]
    per_node: dict[str, list[float]] = {}
    op_of: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= start:
            node = event["name"][: -len("_kernel_time")]
            per_node.setdefault(node, []).append(event["dur"])
            op_of[node] = event["args"]["op_name"]
    us_by_op: dict[str, float] = {}
    for node, durations in per_node.items():
        us_by_op[op_of[node]] = us_by_op.get(op_of[node], 0.0) + statistics.median(durations)
    return {
        "trace": str(trace),
        "model_run_median_us": statistics.median(run["dur"] for run in runs),
        "us_by_op": dict(sorted(us_by_op.items(), key=lambda item: -item[1])),
    }


def _measure(engine, count: int, steps: int, warmup: int) -> dict:
    import numpy as np

    from benchmarks import workload
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest

    films = workload.film_variants(count)
    requests = [
        GenerationRequest(films[i], (ChatTurn("user", QUESTIONS[i]),), max_new_tokens=512) for i in range(count)
    ]
    generations = [engine.start(request) for request in requests]
    try:
        engine.prepare_images(generations)
        for generation in generations:
            while not engine.prefill(generation):
                pass
        sequences = [g.conversation.kv for g in generations]
        tokens = np.asarray([[g.pending] for g in generations], dtype=np.int64)
        pasts = [sequence.past_length for sequence in sequences]
        times, cpu = [], []
        for step in range(warmup + steps):
            started, cpu_started = time.perf_counter(), time.process_time()
            if count > 1:
                engine.executor.decode_batch(sequences, engine.executor.embed(tokens), engine.sliding_window)
            else:
                _one(engine, sequences[0], tokens[0])
            if step >= warmup:
                times.append((time.perf_counter() - started) * 1e3)
                cpu.append((time.process_time() - cpu_started) * 1e3)
    finally:
        for generation in generations:
            engine.finish(generation, cancelled=True)
    return {
        "fastest": min(times),
        "median": statistics.median(times),
        "cpu_median": statistics.median(cpu),
        "pasts_before": pasts,
        "steps": steps,
    }


def _one(engine, sequence, token) -> None:
    """One sequence's decode step as the engine path runs a lone sequence (TRTInference._decode_impl)."""
    import numpy as np

    from medgemma_xray.engine_bundle.masks import attention_masks

    past = sequence.past_length
    query = np.asarray([[past]], dtype=np.int64)
    keys = np.concatenate([[-1], np.arange(past + 1)])[None]
    full, sliding = attention_masks(query, keys, engine.sliding_window)
    sequence.run(engine.executor.embed(token[None]), query, full, sliding)


if __name__ == "__main__":
    raise SystemExit(main())
