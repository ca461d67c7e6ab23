"""Explicit precision in the ONNX with NVIDIA Model Optimizer: Q/DQ for INT8/FP8, AutoCast for FP16/BF16.

What stays in higher precision, and why:
- every non-GEMM op (LayerNorm, RMSNorm, Softmax, GELU, RoPE): ModelOpt quantizes MatMul/Conv/Gemm only, and
  high_precision_dtype="fp32" keeps the rest in fp32, not ModelOpt's fp16 default, because Gemma 3's
  activations overflow fp16 (transformers#36822) and SigLIP loses accuracy in fp16 LayerNorm/softmax
  (NVIDIA/TensorRT#3908, #4373);
- attention's activation-by-activation matmuls (disable_mha_qdq, fp32 accumulation): softmax inputs are the
  part of a transformer most sensitive to INT8 error;
- lm_head: logits decide every greedy token, and it is one GEMM of dozens per layer stack.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

QDQ_PRECISIONS = ("int8", "fp8")
AUTOCAST_PRECISIONS = ("fp16", "bf16")
KEEP_HIGH_PRECISION_NODES = {"decoder": [r".*lm_head.*"], "vision": [], "embed": []}


def quantize_graph(
    graph: str, source: Path, target: Path, precision: str, calibration=None, calibration_method: str = "max"
) -> Path:
    """Write the `precision` version of source to target. calibration: array dict or a FeedReader."""
    if precision == "fp32":
        shutil.copyfile(source, target)
        return target
    if precision in AUTOCAST_PRECISIONS:
        import onnx
        from modelopt.onnx.autocast import convert_to_mixed_precision

        model = convert_to_mixed_precision(
            onnx_path=str(source), low_precision_type=precision, keep_io_types=True, providers=["cpu"]
        )
        onnx.save(model, str(target))
        return target
    if precision not in QDQ_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}")
    from modelopt.onnx.quantization import quantize

    kwargs = (
        {"calibration_data": calibration} if isinstance(calibration, dict) else {"calibration_data_reader": calibration}
    )
    if graph == "embed":  # a gather, nothing to calibrate: keep it exact
        shutil.copyfile(source, target)
        return target
    quantize(
        onnx_path=str(source),
        quantize_mode=precision,
        calibration_method=calibration_method,
        calibration_eps=["cpu"],
        output_path=str(target),
        high_precision_dtype="fp32",
        mha_accumulation_dtype="fp32",
        disable_mha_qdq=True,
        nodes_to_exclude=KEEP_HIGH_PRECISION_NODES.get(graph) or None,
        log_level="WARNING",
        use_external_data_format=_is_large(source),
        **kwargs,
    )
    if not target.is_file():
        raise RuntimeError(f"ModelOpt wrote no output for {source.name}")
    return target


def _is_large(path: Path) -> bool:
    """Over protobuf's 2 GB limit (the real 4B model): weights must live in external data files."""
    return sum(p.stat().st_size for p in path.parent.glob(f"{path.name}*")) > 1_900_000_000


def count_qdq(path: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts = {"QuantizeLinear": 0, "DequantizeLinear": 0}
    for node in model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    return counts
