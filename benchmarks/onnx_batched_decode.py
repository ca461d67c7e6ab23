"""The engine path's decode step on CPU (ONNX Runtime): 1, 2 and 4 sequences, one at a time vs one batched call.

  python -m benchmarks.onnx_batched_decode --bundle engines/demo-fp32 --output results/

Each figure is the fastest of --steps decode steps in ms per step (all sequences advance one token; the median and
the process CPU time are recorded too, since a shared machine disturbs wall time); the sequences
first prefill different questions on different films, so their pasts differ in length, as in serving. Writes
onnx_batched_decode.json and prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

QUESTIONS = ("Findings?", "Is the heart enlarged?", "Any pleural effusion?", "Is there a pneumothorax on the right?")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)

    import numpy as np

    from benchmarks import workload
    from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
    from medgemma_xray.trt_inference.trt_model import TRTInference

    engine = TRTInference(args.bundle, executor="onnxruntime-cpu", sequence_slots=4)
    films = workload.film_variants(4)
    figures = {}
    try:
        for batch in (1, 2, 4):
            requests = [
                GenerationRequest(films[i], (ChatTurn("user", QUESTIONS[i]),), max_new_tokens=512) for i in range(batch)
            ]
            generations = [engine.start(request) for request in requests]
            engine.prepare_images(generations)
            for generation in generations:
                while not engine.prefill(generation):
                    pass
            sequences = [g.conversation.kv for g in generations]
            tokens = np.asarray([[g.pending] for g in generations], dtype=np.int64)
            row = {}
            for how in ("one_at_a_time", "batched"):
                times, cpu = [], []
                for _ in range(args.steps):
                    started, cpu_started = time.perf_counter(), time.process_time()
                    if how == "batched" and batch > 1:
                        engine.executor.decode_batch(sequences, engine.executor.embed(tokens), engine.sliding_window)
                    else:
                        for sequence, token in zip(sequences, tokens, strict=True):
                            _one(engine, sequence, token)
                    times.append((time.perf_counter() - started) * 1e3)
                    cpu.append((time.process_time() - cpu_started) * 1e3)
                # The fastest step is the least disturbed on a shared machine; CPU time counts work, not waiting.
                row[how] = min(times)
                row[f"{how}_median"] = statistics.median(times)
                row[f"{how}_cpu_median"] = statistics.median(cpu)
            figures[batch] = row
            for generation in generations:
                engine.finish(generation, cancelled=True)
    finally:
        engine.close()
    one = figures[1]["one_at_a_time"]
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/onnx_batched_decode.py", *sys.argv[1:]]),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "bundle": str(args.bundle),
        "ms_per_step": figures,
        "batched_4_over_1": figures[4]["batched"] / one,
        "target": "4 sequences in one step under 2x one sequence",
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "onnx_batched_decode.json").write_text(json.dumps(result, indent=1))
    print("| sequences | one at a time: fastest / median / CPU ms | one batched call: fastest / median / CPU ms |")
    print("|---|---|---|")
    for batch, row in figures.items():
        cells = [
            " / ".join(f"{row[key]:.2f}" for key in (how, f"{how}_median", f"{how}_cpu_median"))
            for how in ("one_at_a_time", "batched")
        ]
        print(f"| {batch} | {cells[0]} | {cells[1]} |")
    print(f"4 sequences batched / 1 sequence: {result['batched_4_over_1']:.2f}x (target < 2x)")
    return 0


def _one(engine, sequence, token) -> None:
    """One sequence's decode step as the engine path ran it before batching (and still runs a lone sequence)."""
    import numpy as np

    from medgemma_xray.engine_bundle.masks import attention_masks

    past = sequence.past_length
    query = np.asarray([[past]], dtype=np.int64)
    keys = np.concatenate([[-1], np.arange(past + 1)])[None]
    full, sliding = attention_masks(query, keys, engine.sliding_window)
    sequence.run(engine.executor.embed(token[None]), query, full, sliding)


if __name__ == "__main__":
    raise SystemExit(main())
