"""Weight-only INT8 for a graph's projection MatMuls: per-output-channel symmetric INT8 weights behind a
DequantizeLinear, activations left in fp32.

Why weight-only for the decoder: INT8 activations need one scale per tensor fitted on calibration feeds, and a
long conversation's activations (past 1,500 tokens, after twenty turns) leave the range that short calibration
prompts saw; greedy answers then drift from PyTorch's a few tokens in. Weights are known exactly, so a scale per
output channel fits each one, and the error no longer depends on the prompt. This is TensorRT-LLM's and ModelOpt's
"int8 weight-only" (W8A16) mode; TensorRT runs a DequantizeLinear on a constant weight as a weight-only GEMM, and
ONNX Runtime dequantises it once at session start.

Layers whose activations a sensitivity sweep shows to be safe can still take ModelOpt's W8A8 Q/DQ instead
(`w8a8_nodes`); everything outside the listed MatMuls (norms, rotary, attention scores and softmax, the KV cache,
lm_head) is untouched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

INT8_MAX = 127
# The projections of a transformer layer, as torch's exporter names their MatMuls (/layers.3/mlp/up_proj/MatMul).
PROJECTION_PATTERN = re.compile(r".*/(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)/MatMul$")
# SigLIP's (the vision graph): attention's q/k/v/out projections and the MLP's fc1/fc2
# (/vision_tower/vision_model/encoder/layers.0/mlp/fc1/MatMul).
VISION_PROJECTION_PATTERN = re.compile(r".*/(q_proj|k_proj|v_proj|out_proj|fc1|fc2)/MatMul$")


def quantize_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel INT8 of a (in, out) MatMul weight: (int8 weight, float32 scale per column)."""
    weight = np.asarray(weight, dtype=np.float32)
    scale = np.abs(weight).max(axis=0) / INT8_MAX
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    quantized = np.clip(np.rint(weight / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return quantized, scale


def projection_nodes(model, pattern: re.Pattern = PROJECTION_PATTERN) -> list[str]:
    """Names of the graph's projection MatMuls whose weight is a constant (the candidates for INT8 weights)."""
    constants = {initializer.name for initializer in model.graph.initializer}
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and pattern.match(node.name) and node.input[1] in constants
    ]


def apply_weight_only_int8(model, nodes: Iterable[str]) -> int:
    """Rewrite each named MatMul of `model` (an onnx.ModelProto, changed in place) to take its weight through
    DequantizeLinear(int8 weight, per-column scale, axis=1). Returns how many were rewritten."""
    from onnx import helper, numpy_helper

    wanted = set(nodes)
    initializers = {initializer.name: initializer for initializer in model.graph.initializer}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    rewritten, new_nodes = 0, []
    for node in model.graph.node:
        weight_name = node.input[1] if node.op_type == "MatMul" and len(node.input) > 1 else ""
        if node.name in wanted and weight_name in initializers:
            weight = numpy_helper.to_array(initializers[weight_name])
            quantized, scale = quantize_weight(weight)
            base = f"{node.name}/weight_int8"
            model.graph.initializer.extend(
                [
                    numpy_helper.from_array(quantized, f"{base}/quantized"),
                    numpy_helper.from_array(scale, f"{base}/scale"),
                    numpy_helper.from_array(np.zeros_like(scale, dtype=np.int8), f"{base}/zero_point"),
                ]
            )
            new_nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    [f"{base}/quantized", f"{base}/scale", f"{base}/zero_point"],
                    [f"{base}/dequantized"],
                    name=f"{base}/DequantizeLinear",
                    axis=1,
                )
            )
            node.input[1] = f"{base}/dequantized"
            uses[weight_name] -= 1
            rewritten += 1
        new_nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    unused = [init for init in model.graph.initializer if init.name in uses and uses[init.name] == 0]
    for initializer in unused:  # the fp32 copies nothing reads any more
        model.graph.initializer.remove(initializer)
    return rewritten


def save_graph(model, target: Path, large: bool) -> None:
    """Save a rewritten graph; one over protobuf's 2 GB limit (the real 4B model) with its weights in one
    external data file beside it."""
    import onnx

    target = Path(target)
    if large:
        onnx.save_model(
            model,
            str(target),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{target.name}.data",
            size_threshold=1024,
        )
    else:
        onnx.save(model, str(target))
