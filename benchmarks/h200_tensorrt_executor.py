"""The TensorRT executor with REAL CUDA memory and streams on a GPU host; only the engine is stood in.

Same checks as tests/trt_inference/test_tensorrt_executor.py, but cudaMalloc / cudaMallocHost / cudaMemcpyAsync /
cudaMemcpy2DAsync / cudaMemsetAsync / streams are the GPU's own (cuda.bindings), new device memory is poisoned with
0xFF, and the engine stand-in (devtools.trt_standins.tensorrt_runtime: TensorRT's runtime API over the bundle's
ONNX graphs in ONNX Runtime) reads and writes that device memory with bounds-checked copies. What this does not
execute: TensorRT's own kernels (TensorRT is not installable there; TensorRT-RTX refuses SM90).

Run on the device machine (repo root as working directory; needs torch, transformers, onnx, onnxruntime,
tokenizers, cuda-bindings: all in its image; no ModelOpt, no pydicom):
    python3 -m benchmarks.h200_tensorrt_executor --output $OUT
It makes the demo model unless models/medgemma-demo exists (python3 -m medgemma_xray.demo_model.build), writes 12
PNG phantoms, builds an fp32 bundle (--precision fp32 --target none --device cpu), gives it stand-in plans, and
compares the TensorRT executor with the ONNX Runtime executor. JSON in --output; a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(command: list[str], log: Path) -> None:
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    log.write_text(result.stdout + result.stderr)
    print(
        f"  {' '.join(command[:4])} ... exit {result.returncode} in {time.perf_counter() - started:.0f} s", flush=True
    )
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{result.stderr[-4000:]}")


def prepare_bundle(work: Path, output: Path) -> Path:
    from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize

    model = REPO / "models" / "medgemma-demo"
    if not (model / "config.json").is_file():
        run([sys.executable, "-m", "medgemma_xray.demo_model.build", "--output", str(model)], output / "demo_build.log")
    films = work / "films"
    films.mkdir(parents=True, exist_ok=True)
    for seed in range(12):  # PNG only: the GPU image has no pydicom
        (films / f"synthetic_phantom_{seed:04d}.png").write_bytes(png_bytes(quantize(chest_phantom(seed=seed), 8)))
    bundle = work / "fp32"
    run(
        [
            sys.executable,
            "optimize_trt_engine.py",
            "--model_path",
            str(model),
            "--calib_images",
            str(films),
            "--precision",
            "fp32",
            "--target",
            "none",
            "--device",
            "cpu",
            "--max_seq_len",
            "1536",
            "--max_batch",
            "2",
            "--allow_few_films",
            "--overwrite",
            "--output_path",
            str(bundle),
        ],
        output / "bundle_build.log",
    )
    return bundle


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/h200-tensorrt-executor"))
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    import numpy as np
    import onnxruntime
    from cuda.bindings import driver
    from cuda.bindings import runtime as real_cudart

    from devtools.trt_standins.bundle import installed, make_standin_bundle
    from devtools.trt_standins.cuda_real import CountingCudaRuntime, CudaMemory
    from devtools.trt_standins.scenarios import past_the_window_request, truncate_then_continue, two_turn_requests
    from devtools.trt_standins.tensorrt_runtime import tensorrt_module
    from medgemma_xray.engine_build.comparison import Comparator
    from medgemma_xray.inference_api.errors import NoFreeSlotError
    from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
    from medgemma_xray.trt_inference.runtime.cuda_memory import device_compute_capability
    from medgemma_xray.trt_inference.trt_model import TRTInference
    from medgemma_xray.xray_io import load_radiograph
    from medgemma_xray.xray_io.preprocess import model_input_image

    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "checks": {},
    }
    checks = results["checks"]

    def save() -> None:
        (args.output / "h200_tensorrt_executor.json").write_text(json.dumps(results, indent=2, default=str))

    def check(name: str, passed: bool, detail) -> None:
        checks[name] = {"passed": bool(passed), "detail": detail}
        print(f"  {'PASS' if passed else 'FAIL'} {name}: {detail}", flush=True)
        save()

    gpu_name, capability = device_compute_capability(0)
    results["gpu"], results["compute_capability"] = gpu_name, capability
    print(f"GPU: {gpu_name} (SM {capability})", flush=True)
    fp32 = prepare_bundle(args.workdir, args.output)
    import shutil

    standin = args.workdir / "standin"
    shutil.rmtree(standin, ignore_errors=True)
    make_standin_bundle(fp32, standin, gpu_name, capability)
    film = model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=42), 8))))

    cudart = CountingCudaRuntime(real_cudart)
    memory = CudaMemory(real_cudart, driver)
    free_before = real_cudart.cudaMemGetInfo()[1]
    with installed(tensorrt_module(memory), cudart):
        reference = TRTInference(standin, executor="onnxruntime-cpu")
        started = time.perf_counter()
        # The stand-in plans were never run by a build (plans_verified: false): opened under the operator override.
        engine = TRTInference(standin, executor="tensorrt", allow_unverified_plans=True)
        results["open_s"] = time.perf_counter() - started
        results["device_allocations"] = len(cudart.device)
        results["device_bytes"] = sum(cudart.device.values())
        check("executor is tensorrt on the real GPU", engine.info().executor == "tensorrt", engine.info().device)

        long_request = past_the_window_request(film, tokens=args.tokens)
        requests = [*two_turn_requests(reference, film, tokens=args.tokens), long_request]
        runs = Comparator.run({"onnxruntime-cpu": reference, "tensorrt": engine}, requests)
        differences = Comparator.identical(runs["onnxruntime-cpu"], runs["tensorrt"])
        figures = Comparator.compare_accuracy(runs["onnxruntime-cpu"], runs["tensorrt"], args.tokens)
        results["figures"] = figures
        prompt_tokens = int(reference.prompt_ids(long_request).shape[1])
        check(
            "two-turn + past-window conversation token for token",
            not differences and prompt_tokens > 562,
            {
                "differences": differences,
                "tokens": [len(s) for s in runs["tensorrt"].steps],
                "long_prompt_tokens": prompt_tokens,
                "logprob_delta_max": figures["logprob_delta_max"],
            },
        )

        truncation = [
            truncate_then_continue(engine.executor, 512, list(range(10, 60)), list(range(100, 112)), keep)
            for keep in (0, 20, 55)
        ]
        check("truncate keeps exactly the first tokens (cudaMemcpy2DAsync)", max(truncation) < 1e-5, truncation)

        films = [film.rotate(angle) for angle in (0, 3, 6, 9, 12)]
        before = engine.executor.vision_context.executions
        difference = float(np.abs(engine.image_features(films) - reference.image_features(films)).max())
        chunks = engine.executor.vision_context.executions - before
        check(
            "vision batch of 5 split by max_batch 2",
            chunks == 3 and difference < 1e-5,
            {"chunks": chunks, "max_abs_difference": difference},
        )

        held = [engine.executor.new_sequence(timeout_s=0) for _ in range(engine.executor.slots.capacity)]
        started = time.monotonic()
        try:
            engine.executor.new_sequence(timeout_s=0.3)
            timed_out = None
        except NoFreeSlotError:
            timed_out = time.monotonic() - started
        for sequence in held:
            sequence.close()
        check("no free slot: NoFreeSlotError after the timeout", timed_out is not None and timed_out >= 0.3, timed_out)

        engine.close()
        reference.close()
        check(
            "every allocation and stream freed on close",
            cudart.live == (0, 0, 0),
            {"live (device, pinned, streams)": cudart.live, "mallocs": cudart.mallocs, "frees": cudart.frees},
        )

        leaks = {}
        for failing in (0, 7, 40):
            cudart.fail_malloc_after = cudart.mallocs + failing
            try:
                TRTInference(standin, executor="tensorrt", allow_unverified_plans=True).close()
                leaks[failing] = "no failure injected (fewer allocations)"
            except RuntimeError:
                leaks[failing] = cudart.live
        cudart.fail_malloc_after = None
        check(
            "a construction failing part-way frees what it allocated",
            all(value == (0, 0, 0) for value in leaks.values() if not isinstance(value, str)),
            leaks,
        )
    results["device_free_bytes_before_after"] = [free_before, real_cudart.cudaMemGetInfo()[1]]
    results["bytes_through_engine_standin"] = {"read": memory.bytes_read, "written": memory.bytes_written}
    save()

    print("\n| check (real CUDA memory and streams; engine stood in by ONNX Runtime) | result |")
    print("|---|---|")
    for name, outcome in checks.items():
        print(f"| {name} | {'pass' if outcome['passed'] else 'FAIL'} |")
    print(
        f"\n{gpu_name}: {results['device_allocations']} device buffers, {results['device_bytes'] / 1e6:.1f} MB; "
        f"{memory.bytes_read / 1e6:.0f} MB read and {memory.bytes_written / 1e6:.0f} MB written by the stand-in"
    )
    return 0 if all(outcome["passed"] for outcome in checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
