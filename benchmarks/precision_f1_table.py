"""Per-finding F1 of PyTorch and of engine bundles on the same held-out phantoms: the precision table.

    python -m benchmarks.precision_f1_table --model_path demo_model/trained \
        --bundle int8=/tmp/b/int8 --bundle fp16=/tmp/b/fp16 --phantoms 50 --start_seed 0

Bundles run through ONNX Runtime on the CPU (the executor the build's gate uses where no GPU is). Prints the
Markdown table and each backend's wall time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from medgemma_xray.engine_build.task_gate import MAX_NEW_TOKENS
    from medgemma_xray.phantoms.evaluation import format_table, held_out_phantoms, task_accuracy
    from medgemma_xray.pytorch_backend.eager import TorchInference
    from medgemma_xray.trt_inference.trt_model import TRTInference

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_path", type=Path, required=True)
    parser.add_argument("--bundle", action="append", default=[], help="name=folder, once per bundle")
    parser.add_argument("--phantoms", type=int, default=50)
    parser.add_argument("--start_seed", type=int, default=0)
    args = parser.parse_args(argv)
    phantoms = held_out_phantoms(args.phantoms, args.start_seed)
    backends = {"PyTorch": lambda: TorchInference(args.model_path, device="cpu")}
    for spec in args.bundle:
        name, folder = spec.split("=", 1)
        backends[name] = lambda folder=folder: TRTInference(folder, executor="onnxruntime-cpu")
    results, seconds = {}, {}
    for name, open_backend in backends.items():
        backend = open_backend()
        started = time.perf_counter()
        try:
            results[name] = task_accuracy(backend, phantoms, max_new_tokens=MAX_NEW_TOKENS, share_film_prefix=True)
        finally:
            backend.close()
        seconds[name] = time.perf_counter() - started
    print(format_table(results))
    print()
    print("wall time: " + ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
