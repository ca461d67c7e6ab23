"""Every precision finishes or is refused before work starts, and fp16 keeps norms, softmax and lm_head in fp32."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from tests.conftest import WITHOUT_THE_F1_GATE, assert_refused_before_any_work, run_optimizer

pytestmark = pytest.mark.slow
FP16, FP32 = 10, 1


def build_args(demo_model_dir, films, out, precision, *extra) -> list[str]:
    return [
        "--model_path",
        str(demo_model_dir),
        "--calib_images",
        str(films),
        "--output_path",
        str(out),
        "--precision",
        precision,
        "--max_seq_len",
        "512",
        "--max_batch",
        "2",
        "--allow_few_films",
        "--verify_tokens",
        "8",
        *WITHOUT_THE_F1_GATE,
        *extra,
    ]


def node_types(path):
    """{node: (its op type, the element types of its inputs and outputs)} from the graph's own type inference."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types = {
        v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]
    }
    types.update({init.name: init.data_type for init in model.graph.initializer})
    return {
        node.name: (node.op_type, {types.get(name) for name in [*node.input, *node.output] if name})
        for node in model.graph.node
    }


def test_fp16_finishes_on_cpu_with_fp32_norms_softmax_and_lm_head(demo_model_dir, synthetic_films, tmp_path):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    out = tmp_path / "fp16"
    result = run_optimizer(*build_args(demo_model_dir, synthetic_films, out, "fp16", "--target", "none"))
    assert result.returncode == 0, result.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "fp16" and manifest["accuracy"]["passed"] is True
    for graph in ("vision", "decoder"):
        nodes = node_types(out / "onnx" / "fp16" / f"{graph}.onnx")
        # Compute nodes only: AutoCast's own Casts sit at the fp16/fp32 boundary (and the demo's exporter shares
        # identical norm weights with fp16 layers, so those arrive through a cast to fp32).
        kept = {
            name: types
            for name, (op, types) in nodes.items()
            if op != "Cast" and ("norm" in name or "lm_head" in name or op in ("Softmax", "LayerNormalization"))
        }
        assert kept and all(FP16 not in types for types in kept.values()), [n for n, t in kept.items() if FP16 in t]
        assert sum(1 for op, types in nodes.values() if op == "MatMul" and FP16 in types) >= 4, graph  # converted
        softmax = [types for op, types in nodes.values() if op == "Softmax"]
        assert softmax and all(types == {FP32} for types in softmax)
    backend = TRTInference(out, executor="onnxruntime-cpu")
    assert backend.executor.optimization_level == "ORT_ENABLE_EXTENDED"
    backend.close()


def test_bf16_is_refused_before_export_where_nothing_can_run_it(demo_model_dir, synthetic_films, tmp_path):
    result = run_optimizer(*build_args(demo_model_dir, synthetic_films, tmp_path / "bf16", "bf16", "--target", "none"))
    assert result.returncode == 2
    assert "bf16 cannot be verified on this host: ONNX Runtime's CPU provider has no bf16 kernels" in result.stderr
    assert "--target tensorrt" in result.stderr
    assert_refused_before_any_work(result.stderr)
    assert not (tmp_path / "bf16").exists()


@pytest.mark.parametrize(
    ("target_args", "message"),
    [
        (["--target", "tensorrt-rtx", "--compute_capabilities", "SM80,SM86"], "fp8 cannot run on SM80, SM86"),
        (["--target", "tensorrt-rtx", "--compute_capabilities", "SM80"], "FP8 needs compute capability 8.9 or newer"),
        (["--target", "tensorrt"], "--target tensorrt"),
        # Plans that cannot run on this host, or none at all: nothing here can verify fp8 (these used to
        # build, and passed or failed depending on how many films were held out).
        (["--target", "tensorrt-rtx"], "fp8 cannot be verified on this host"),
        (["--target", "none"], "fp8 cannot be verified on this host"),
    ],
)
def test_fp8_is_refused_for_targets_and_hosts_that_cannot_run_and_verify_it(
    demo_model_dir, synthetic_films, tmp_path, target_args, message
):
    result = run_optimizer(*build_args(demo_model_dir, synthetic_films, tmp_path / "fp8", "fp8", *target_args))
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert_refused_before_any_work(result.stderr)
    assert not (tmp_path / "fp8").exists()


@pytest.mark.parametrize("target", ["none", "tensorrt-rtx", "auto"])
def test_fp8_is_refused_in_under_2_s_on_a_host_that_cannot_verify_it(demo_model_dir, synthetic_films, tmp_path, target):
    """The refusal itself (argument parsing, the checks, the message), timed inside the process on this thread's
    CPU clock: another process on a loaded machine cannot stretch it, and the checks run on this thread."""
    import optimize_trt_engine

    args = build_args(demo_model_dir, synthetic_films, tmp_path / "fp8", "fp8", "--target", target)
    started = time.thread_time()
    assert optimize_trt_engine.main(args) == 2
    assert time.thread_time() - started < 2
    assert not (tmp_path / "fp8").exists()


def test_fp8_plans_for_tensorrt_rtx_target_only_sm89_and_newer():
    from medgemma_xray.engine_build.precision import PrecisionRefusedError, plan_build

    with pytest.raises(PrecisionRefusedError, match="ONNX Runtime's CPU provider only emulates FP8"):
        plan_build("fp8", "tensorrt-rtx", None, None, "no GPU here")
    assert plan_build("int8", "tensorrt-rtx", None, None, "").compute_capabilities == ("SM80", "SM86", "SM89", "SM120")
    on_an_rtx_4090 = plan_build("fp8", "tensorrt-rtx", None, ("NVIDIA GeForce RTX 4090", "8.9"), "")
    assert on_an_rtx_4090.compute_capabilities == ("SM89", "SM120")
    assert on_an_rtx_4090.verify_executor == "tensorrt"  # the plans run here: they are what gets verified


def test_fp8_graphs_run_in_onnxruntime_as_written(int8_bundle, tmp_path):
    """ORT_ENABLE_BASIC runs ModelOpt's FP8 Q/DQ as written; higher levels fuse it into a kernel that rejects float8."""
    import onnxruntime as ort

    from medgemma_xray.engine_build.quantize import quantize_graph
    from medgemma_xray.trt_inference.runtime.onnx_executor import OPTIMIZATION_LEVELS

    # A copy: ModelOpt may rewrite the graph it reads, and the bundle is shared by the session's other tests
    # (its integrity check then refuses it).
    source = tmp_path / "vision.onnx"
    shutil.copyfile(int8_bundle / "onnx" / "fp32" / "vision.onnx", source)
    rng = np.random.default_rng(0)
    pixels = rng.uniform(-1, 1, (2, 3, 896, 896)).astype(np.float32)
    target = tmp_path / "vision.fp8.onnx"
    quantize_graph("vision", source, target, "fp8", {"pixel_values": pixels})

    def session(path, level):
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    expected = session(source, "ORT_ENABLE_ALL").run(None, {"pixel_values": pixels[:1]})[0].ravel()
    produced = session(target, OPTIMIZATION_LEVELS["fp8"]).run(None, {"pixel_values": pixels[:1]})[0].ravel()
    assert expected @ produced / np.linalg.norm(expected) / np.linalg.norm(produced) > 0.99
    assert not np.array_equal(expected, produced)  # quantized for real
    with pytest.raises(Exception, match="float8"):
        session(target, "ORT_ENABLE_ALL")
