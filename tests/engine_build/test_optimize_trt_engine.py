"""optimize_trt_engine.py end to end on the demo checkpoint and synthetic films, as CI can run it."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_optimizer

pytestmark = pytest.mark.slow


def test_int8_bundle_manifest_records_the_build(int8_bundle, synthetic_films):
    manifest = json.loads((int8_bundle / "manifest.json").read_text())
    assert manifest["precision"] == "int8"
    assert manifest["model"]["is_demo"] and len(manifest["model"]["weights_sha256"]) == 64
    assert manifest["calibration"]["films"] == 10 and manifest["calibration"]["held_out"] == 2
    assert manifest["calibration"]["below_recommended"] is True
    assert len(manifest["calibration"]["sha256"]) == 64
    assert manifest["shapes"]["image_tokens"] == 256 and manifest["shapes"]["image_size"] == 896
    assert manifest["tensorrt"]["target"] == "tensorrt-rtx" and manifest["tensorrt"]["version"].startswith("1.")
    accuracy = manifest["accuracy"]
    assert accuracy["passed"] is True
    assert accuracy["image_embedding_cosine_min"] >= 0.99
    assert accuracy["token_agreement_mean"] >= 0.9
    assert max(accuracy["export_parity_max_relative_error"].values()) < 1e-4
    assert manifest["build"]["seconds"] > 0 and "--precision int8" in manifest["build"]["command"]


def test_graphs_carry_explicit_qdq(int8_bundle):
    import onnx

    for graph, minimum in (("vision", 8), ("decoder", 8)):
        model = onnx.load(str(int8_bundle / "onnx" / "int8" / f"{graph}.onnx"))
        ops = [node.op_type for node in model.graph.node]
        assert ops.count("QuantizeLinear") >= minimum and ops.count("DequantizeLinear") >= minimum, graph
        excluded = [n for n in model.graph.node if n.op_type == "MatMul" and "lm_head" in n.name]
        if graph == "decoder":  # lm_head stays in high precision: its inputs come from no DequantizeLinear
            producers = {output: node.op_type for node in model.graph.node for output in node.output}
            assert excluded and all(producers.get(name) != "DequantizeLinear" for name in excluded[0].input)


def test_tensorrt_rtx_built_every_graph_fp_and_qdq(int8_bundle, tmp_path):
    """TensorRT's ONNX parser and builder accept every graph we export: fp32 and the Q/DQ versions."""
    from engine_build.builder import EngineBuilder, graph_profiles

    manifest = json.loads((int8_bundle / "manifest.json").read_text())
    for graph in ("vision", "embed", "decoder"):
        plan = int8_bundle / manifest["graphs"][graph]["engine"]
        assert plan.stat().st_size > 10_000, graph
    builder = EngineBuilder("tensorrt-rtx", workspace_gib=1)
    profiles = graph_profiles(manifest["shapes"])
    for graph in ("vision", "embed", "decoder"):
        seconds = builder.build(
            int8_bundle / "onnx" / "fp32" / f"{graph}.onnx", tmp_path / f"{graph}.fp32.plan", profiles[graph]
        )
        assert seconds > 0 and (tmp_path / f"{graph}.fp32.plan").stat().st_size > 10_000


def test_build_fails_when_accuracy_crosses_a_threshold(demo_model_dir, synthetic_films, tmp_path):
    result = run_optimizer(
        "--model_path", str(demo_model_dir), "--calib_images", str(synthetic_films), "--precision", "int8",
        "--output_path", str(tmp_path / "strict"), "--target", "none", "--min_cosine", "0.9999999", "--allow_few_films",
    )  # fmt: skip
    assert result.returncode == 1
    assert "precision regression: image embedding cosine" in result.stderr
    manifest = json.loads((tmp_path / "strict" / "manifest.json").read_text())
    assert manifest["accuracy"]["passed"] is False


def test_bad_inputs_exit_non_zero_with_a_reason(demo_model_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_optimizer(
        "--model_path", str(demo_model_dir), "--calib_images", str(empty), "--output_path", str(tmp_path / "x")
    )
    assert result.returncode == 1 and "no usable films" in result.stderr
    result = run_optimizer(
        "--model_path", str(tmp_path), "--calib_images", str(empty), "--output_path", str(tmp_path / "y")
    )
    assert result.returncode == 1 and "not a model directory" in result.stderr


def test_onnx_only_bundle_can_be_finished_later(fp32_bundle, tmp_path):
    bundle = tmp_path / "finish"
    shutil.copytree(fp32_bundle, bundle)
    assert json.loads((bundle / "manifest.json").read_text())["graphs"]["decoder"]["engine"] is None
    result = run_optimizer("--from_onnx", str(bundle), "--target", "tensorrt-rtx", "--workspace_gib", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["graphs"]["decoder"]["engine"] == "engines/decoder.plan"
    assert (bundle / "engines" / "decoder.plan").is_file()
