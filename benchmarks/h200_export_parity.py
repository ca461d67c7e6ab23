"""Full-size check on a GPU host: export a MedGemma-4B-shaped model (random weights) with the engine pipeline's
exporter and compare every graph with PyTorch in ONNX Runtime (CPU), on prefill and decode shapes.

Run on the device machine:  python3 -m benchmarks.h200_export_parity --output $OUT
Random weights give real shapes and sizes, not meaningful text. Prints a table last; JSON in --output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path


def medgemma_4b_config():
    """MedGemma-4B's published sizes (benchmarks.random_model) with Gemma 3's own image-token ids."""
    from transformers import Gemma3Config

    from benchmarks.random_model import MEDGEMMA_4B_TEXT, MEDGEMMA_4B_VISION

    return Gemma3Config(
        text_config=dict(MEDGEMMA_4B_TEXT),
        vision_config=dict(MEDGEMMA_4B_VISION),
        mm_tokens_per_image=256,
        boi_token_index=255999,
        eoi_token_index=256000,
        image_token_index=262144,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", type=Path, default=Path("."))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/medgemma-export"))
    parser.add_argument("--graphs", default="vision,embed,decoder", help="comma-separated subset to export and check")
    args = parser.parse_args()
    import onnxruntime
    import torch
    import transformers
    from transformers import Gemma3ForConditionalGeneration

    from medgemma_xray.engine_build.graphs import export_graphs
    from medgemma_xray.engine_build.parity import check_export_parity

    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "gpu": torch.cuda.get_device_name(0),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
    }

    def save() -> None:
        (args.output / "h200_export_parity.json").write_text(json.dumps(results, indent=2))

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 reference means fp32: no TF32 in GEMMs or convolutions
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device("cuda"):
        model = Gemma3ForConditionalGeneration(medgemma_4b_config())
    model = model.float().eval()
    with torch.no_grad():  # transformers zero-initialises the projector; zeros would make the vision check vacuous
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.02)
    model.set_attn_implementation("eager")
    results["params_billion"] = sum(p.numel() for p in model.parameters()) / 1e9
    results["init_s"] = time.perf_counter() - started
    print(
        f"model: {results['params_billion']:.2f} B params fp32 on {results['gpu']} in {results['init_s']:.0f} s",
        flush=True,
    )
    save()

    pixels = torch.randn(1, 3, 896, 896, device="cuda")
    started = time.perf_counter()
    graphs = tuple(args.graphs.split(","))
    export_graphs(
        model,
        args.workdir,
        pixels,
        graphs=graphs,
        progress=lambda g: print(f"  exported {g} at {time.perf_counter() - started:.0f} s", flush=True),
    )
    results["export_s"] = time.perf_counter() - started
    results["onnx_bytes"] = {
        p.name: p.stat().st_size for p in sorted(args.workdir.iterdir()) if p.name.split(".")[0] in graphs
    }
    save()

    started = time.perf_counter()
    figures = check_export_parity(model, args.workdir, pixels, tolerance=1e-2, graphs=graphs)
    results["parity_max_relative_error"] = figures
    results["parity_s"] = time.perf_counter() - started
    save()

    print("\n| graph / shape | max relative error (ORT CPU fp32 vs PyTorch CUDA fp32) |")
    print("|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value:.2e} |")
    print(
        f"\nexport {results['export_s']:.0f} s, parity {results['parity_s']:.0f} s; ONNX sizes (GB): "
        + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in results["onnx_bytes"].items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
