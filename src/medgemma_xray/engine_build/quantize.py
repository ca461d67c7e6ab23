"""Explicit precision in the ONNX with NVIDIA Model Optimizer: Q/DQ for INT8/FP8, AutoCast for FP16/BF16.

INT8 in the decoder is weight-only by default (engine_build/weight_only.py): per-output-channel INT8 weights on
the seven projection MatMuls of every layer, activations in fp32. ModelOpt's W8A8 (INT8 activations with one
calibrated scale per tensor) lost the long conversation on the demo model (top-1 agreement 0.94 and a largest
KL of 1.5 nats over a 1,578-token conversation's answer, against 1.00 and 0.0007 weight-only); a per-layer
sensitivity sweep (benchmarks/int8_sensitivity.py) names the layers whose activations can still take W8A8, and
--int8_w8a8_layers gives them to ModelOpt. The vision graph is weight-only INT8 as well (its q/k/v/out and fc1/fc2
projections): ModelOpt's W8A8 there held the image embedding at cosine 0.9997, yet the demo model retrained to
point and compare moved a film's first answer token by a KL of 0.096 against the gate's 0.05 (weight-only: 0.0017,
2026-12-03, optimize_trt_engine.py --precision int8 on the demo checkpoint).

What stays in higher precision, and why:
- every non-GEMM op (LayerNorm, RMSNorm, Softmax, GELU, RoPE): ModelOpt quantizes MatMul/Conv/Gemm only, and
  high_precision_dtype="fp32" keeps the rest in fp32, not ModelOpt's fp16 default, because Gemma 3's
  activations overflow fp16 (transformers#36822) and SigLIP loses accuracy in fp16 LayerNorm/softmax
  (NVIDIA/TensorRT#3908, #4373);
- attention's activation-by-activation matmuls (disable_mha_qdq, fp32 accumulation): softmax inputs are the
  part of a transformer most sensitive to INT8 error;
- lm_head: logits decide every greedy token, and it is one GEMM of dozens per layer stack.
For fp16/bf16 (AutoCast) the same rule is explicit: every node of a norm (RMSNorm's Pow/ReduceMean/Sqrt/Div
chain, SigLIP's LayerNormalization), the rotary embedding, attention itself (everything but the q/k/v/o
projections: rotation, scores, softmax, weighted sum), every Softmax and lm_head are excluded by name and type, and AutoCast's
data-driven rule runs on the calibration films' own activations (nodes whose values exceed fp16's safe range stay
fp32). The embed graph (a gather) stays exact.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

QDQ_PRECISIONS = ("int8", "fp8")
AUTOCAST_PRECISIONS = ("fp16", "bf16")
KEEP_HIGH_PRECISION_NODES = {"decoder": [r".*lm_head.*"], "vision": [], "embed": []}
# AutoCast: node-name patterns and op types kept in fp32 (names as torch's exporter scopes them: .../q_norm/Pow).
# - rotary_emb: positions times inverse frequencies lose their fraction in fp16 past a few hundred tokens
#   (greedy agreement with PyTorch fell to 0.08 on a 1,539-token conversation with it in fp16);
# - ops directly in a self_attn scope (not its q/k/v/o projections, which are sub-scopes): the rotary rotation,
#   the scores, their scaling and softmax, and the weighted sum of values;
# - the decoder wrapper's own ops (names with a single scope level).
AUTOCAST_FP32_NODES = [r".*norm.*", r".*lm_head.*", r".*rotary_emb.*", r".*/self_attn/[^/]+$", r"^/[^/]+$"]
AUTOCAST_FP32_OP_TYPES = ["Softmax", "LayerNormalization"]
AUTOCAST_CALIBRATION_BATCHES = 4  # each is a full reference run with every tensor kept: memory and time


class _NoNvmlNoise(logging.Filter):
    """ModelOpt asks NVML for a GPU count even when calibrating on the CPU, and logs an ERROR where there is no
    driver. On a CPU build that is expected: say so once at INFO instead of an ERROR line in a successful build."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith("Failed to get GPU count"):
            if not self.seen:
                self.seen = True
                logger.info("  no NVIDIA driver here (%s): ModelOpt calibrates on the CPU", record.getMessage())
            return False
        return True


def _warnings_and_above(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


@contextlib.contextmanager
def _modelopt_logging():
    """Scoped: ModelOpt's NVML error filtered; AutoCast's per-node INFO lines (hundreds) dropped. Filters, not
    levels: AutoCast re-configures its logger's level on every call."""
    onnx_logger, autocast_logger = logging.getLogger("modelopt.onnx"), logging.getLogger("modelopt.onnx.autocast")
    nvml_filter = _NoNvmlNoise()
    onnx_logger.addFilter(nvml_filter)
    autocast_logger.addFilter(_warnings_and_above)
    try:
        yield
    finally:
        onnx_logger.removeFilter(nvml_filter)
        autocast_logger.removeFilter(_warnings_and_above)


def quantize_graph(
    graph: str,
    source: Path,
    target: Path,
    precision: str,
    calibration=None,
    calibration_method: str = "max",
    w8a8_layers: tuple[str, ...] = (),
) -> Path:
    """Write the `precision` version of source to target. calibration: array dict or a FeedReader. w8a8_layers:
    for the INT8 decoder, name fragments of the projections (layers.2/mlp) that take ModelOpt's W8A8; the rest of
    the projections take weight-only INT8."""
    if precision == "fp32":
        shutil.copyfile(source, target)
        return target
    if precision in AUTOCAST_PRECISIONS:
        if graph == "embed":  # a gather: exact in fp32, and nothing to gain in accuracy from casting it
            shutil.copyfile(source, target)
            return target
        with _modelopt_logging():
            _autocast(graph, source, target, precision, calibration)
        return target
    if precision not in QDQ_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}")
    kwargs = (
        {"calibration_data": calibration} if isinstance(calibration, dict) else {"calibration_data_reader": calibration}
    )
    if graph == "embed":  # a gather, nothing to calibrate: keep it exact
        shutil.copyfile(source, target)
        return target
    if graph == "decoder" and precision == "int8":
        _decoder_int8(source, target, calibration_method, kwargs, w8a8_layers)
        return target
    if graph == "vision" and precision == "int8":
        _vision_int8(source, target)
        return target
    with _modelopt_logging():
        _quantize_qdq(graph, source, target, precision, calibration_method, kwargs)
    if not target.is_file():
        raise RuntimeError(f"ModelOpt wrote no output for {source.name}")
    return target


def _decoder_int8(source: Path, target: Path, calibration_method: str, kwargs, w8a8_layers: tuple[str, ...]) -> None:
    """Weight-only INT8 on every projection, except those named in w8a8_layers, which ModelOpt quantizes W8A8."""
    import re

    import onnx

    from medgemma_xray.engine_build.weight_only import apply_weight_only_int8, projection_nodes, save_graph

    if w8a8_layers:
        projections = projection_nodes(onnx.load(str(source), load_external_data=False))
        unknown = [key for key in w8a8_layers if not any(key in name for name in projections)]
        if unknown:
            raise ValueError(
                f"--int8_w8a8_layers {','.join(unknown)} names no projection of the decoder (they look like "
                f"{projections[0].split('/')[2]}/self_attn or {projections[0].split('/')[2]}/mlp)"
            )
        keep = [name for name in projections if not any(key in name for key in w8a8_layers)]
        excluded = (*KEEP_HIGH_PRECISION_NODES["decoder"], *(re.escape(name) for name in keep))
        with _modelopt_logging():
            _quantize_qdq("decoder", source, target, "int8", calibration_method, kwargs, excluded)
        source = target
    model = onnx.load(str(source))
    apply_weight_only_int8(model, projection_nodes(model))  # what ModelOpt left unquantized
    save_graph(model, target, large=_is_large(source))


def _vision_int8(source: Path, target: Path) -> None:
    """Weight-only INT8 on every SigLIP projection; activations stay fp32 (no calibration needed)."""
    import onnx

    from medgemma_xray.engine_build.weight_only import (
        VISION_PROJECTION_PATTERN,
        apply_weight_only_int8,
        projection_nodes,
        save_graph,
    )

    model = onnx.load(str(source))
    nodes = projection_nodes(model, VISION_PROJECTION_PATTERN)
    if not nodes:
        raise RuntimeError(f"{source.name}: no SigLIP projection MatMul found to quantise (names changed?)")
    apply_weight_only_int8(model, nodes)
    save_graph(model, target, large=_is_large(source))


def _quantize_qdq(
    graph: str,
    source: Path,
    target: Path,
    precision: str,
    calibration_method: str,
    kwargs,
    nodes_to_exclude: tuple[str, ...] | None = None,
) -> None:
    from modelopt.onnx.quantization import quantize

    excluded = list(nodes_to_exclude) if nodes_to_exclude is not None else KEEP_HIGH_PRECISION_NODES.get(graph)

    quantize(
        onnx_path=str(source),
        quantize_mode=precision,
        calibration_method=calibration_method,
        calibration_eps=["cpu"],
        output_path=str(target),
        high_precision_dtype="fp32",
        mha_accumulation_dtype="fp32",
        disable_mha_qdq=True,
        nodes_to_exclude=excluded or None,
        log_level="WARNING",
        use_external_data_format=_is_large(source),
        **kwargs,
    )


def _autocast(graph: str, source: Path, target: Path, precision: str, calibration) -> None:
    """AutoCast with norms, softmax and lm_head pinned to fp32, its data rule fed the calibration activations."""
    import numpy as np
    from modelopt.onnx.autocast import convert_to_mixed_precision

    from medgemma_xray.engine_build.weight_only import save_graph

    with tempfile.TemporaryDirectory(prefix="autocast-", dir=target.parent) as scratch:
        calibration_dir = None
        batches = _calibration_batches(calibration)
        if batches:
            calibration_dir = Path(scratch)
            for index, batch in enumerate(batches[:AUTOCAST_CALIBRATION_BATCHES]):
                np.savez(calibration_dir / f"batch_{index:04d}.npz", **batch)
        model = convert_to_mixed_precision(
            onnx_path=str(source),
            low_precision_type=precision,
            nodes_to_exclude=AUTOCAST_FP32_NODES,
            op_types_to_exclude=AUTOCAST_FP32_OP_TYPES,
            keep_io_types=True,
            calibration_data=str(calibration_dir) if calibration_dir else None,
            providers=["cpu"],
        )
    save_graph(model, target, large=_is_large(source))


def _calibration_batches(calibration) -> list[dict]:
    """Feeds for AutoCast's reference run: a {name: batch array} dict is split per sample; a FeedReader as is."""
    if calibration is None:
        return []
    if isinstance(calibration, dict):
        count = len(next(iter(calibration.values())))
        return [{name: value[index : index + 1] for name, value in calibration.items()} for index in range(count)]
    feeds = list(getattr(calibration, "feeds", []))
    step = max(1, len(feeds) // AUTOCAST_CALIBRATION_BATCHES)
    return feeds[::step]


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
