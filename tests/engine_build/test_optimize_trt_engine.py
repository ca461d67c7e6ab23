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
    assert manifest["calibration"]["films"] == 8 and manifest["calibration"]["held_out"] == 4  # 10%, at least 4
    assert manifest["calibration"]["below_recommended"] is True
    assert manifest["calibration"]["synthetic_films"] == 12 and manifest["calibration"]["real_films"] == 0
    assert len(manifest["calibration"]["sha256"]) == 64
    assert manifest["shapes"]["image_tokens"] == 256 and manifest["shapes"]["image_size"] == 896
    assert manifest["tensorrt"]["target"] == "tensorrt-rtx" and manifest["tensorrt"]["version"].startswith("1.")
    accuracy = manifest["accuracy"]
    assert accuracy["passed"] is True
    assert accuracy["image_embedding_cosine_min"] >= 0.99
    assert accuracy["token_agreement_mean"] >= 0.9
    assert max(accuracy["export_parity_max_relative_error"].values()) < 1e-4
    # The long multi-turn case, at the default thresholds, over the whole answer.
    from medgemma_xray.engine_bundle.gate import DEFAULT_THRESHOLDS, thresholds_lowered

    long_case = accuracy["long_conversation"]
    assert 1500 <= long_case["prompt_tokens"] <= 2048 - 16 and long_case["turns"] >= 3
    assert {key: accuracy["thresholds"][key] for key in DEFAULT_THRESHOLDS} == DEFAULT_THRESHOLDS
    assert not thresholds_lowered(accuracy)
    assert long_case["token_agreement"] >= 0.9 and long_case["top1_agreement"] >= 0.9
    assert long_case["kl_max"] <= 0.05 and long_case["answer_positions"] >= 2
    recipe = manifest["calibration"]["int8_recipe"]
    assert recipe["decoder"].startswith("weight-only INT8") and recipe["decoder_w8a8_layers"] == []
    # TensorRT-RTX plans cannot run on this host: the record says the figures come from the ONNX graphs.
    assert accuracy["executor"] == "onnxruntime-cpu" and accuracy["plans_verified"] is False
    assert "TensorRT-RTX plans cannot run on this host" in accuracy["measured_on"]
    assert manifest["build"]["seconds"] > 0 and "--precision int8" in manifest["build"]["command"]
    files = manifest["integrity"]["files"]
    for name in ("engines/decoder.plan", "onnx/int8/decoder.onnx", "tokenizer.json", "processor_config.json"):
        assert len(files[name]["sha256"]) == 64 and files[name]["bytes"] > 0


def test_fp32_logs_no_quantization_and_records_no_calibration(fp32_bundle):
    """fp32 serves the exported graphs: no ModelOpt step in its log, no calibration in its manifest (only the
    held-out films' hash, which --from_onnx needs to find them again)."""
    log = (fp32_bundle.parent / "build.log").read_text()
    assert "[2/4] no quantization: fp32 serves the exported graphs" in log
    assert "ModelOpt" not in log and "calibration: none (fp32 is not quantized)" in log
    calibration = json.loads((fp32_bundle / "manifest.json").read_text())["calibration"]
    assert calibration["used"] is False and len(calibration["sha256"]) == 64 and calibration["held_out"] == 4
    assert not {"films", "decoder_feeds", "method", "qdq_nodes"} & set(calibration)


def test_a_successful_build_logs_no_error_and_a_self_consistent_profile(int8_bundle):
    log = (int8_bundle.parent / "build.log").read_text()
    assert " ERROR " not in log and "Error Code" not in log  # ModelOpt's NVML probe, TensorRT-RTX's timing cache
    assert "not self-consistent" not in log
    # The default INT8 is weight-only in both graphs: ModelOpt is not run, and the log does not say it is.
    assert "quantize to int8: weight-only INT8" in log and "quantize to int8 with ModelOpt" not in log


def test_the_decoder_profile_satisfies_past_plus_new_equals_total():
    from medgemma_xray.engine_build.builder import graph_profiles

    shapes = {
        "max_batch": 2,
        "image_size": 896,
        "hidden": 128,
        "image_tokens": 256,
        "max_sequence": 1024,
        "kv_heads": 2,
        "head_dim": 32,
        "layers": 2,
    }
    decoder = graph_profiles(shapes)["decoder"].shapes
    for level in range(3):  # kMIN, kOPT, kMAX
        new, past = decoder["inputs_embeds"][level][1], decoder["past_key_0"][level][2]
        assert decoder["full_mask"][level][3] == decoder["sliding_mask"][level][3] == new + past
    # the past is the cache at its capacity: up to max_sequence + 1 rows, the dead slot included (format 2)
    assert decoder["inputs_embeds"][2][1] == 1024 and decoder["past_key_1"][2][2] == 1025


def test_graphs_carry_explicit_qdq(int8_bundle):
    """Vision and decoder: weight-only INT8, a DequantizeLinear of a constant int8 weight into each projection
    (SigLIP's six per layer, the decoder's seven), no QuantizeLinear (activations stay fp32), and lm_head, the
    norms and attention untouched."""
    import onnx

    from medgemma_xray.engine_build.weight_only import VISION_PROJECTION_PATTERN

    vision = onnx.load(str(int8_bundle / "onnx" / "int8" / "vision.onnx"))
    ops = [node.op_type for node in vision.graph.node]
    projections = [n for n in vision.graph.node if n.op_type == "MatMul" and VISION_PROJECTION_PATTERN.match(n.name)]
    dequantized = {out for n in vision.graph.node if n.op_type == "DequantizeLinear" for out in n.output}
    assert ops.count("QuantizeLinear") == 0 and len(projections) >= 6
    assert ops.count("DequantizeLinear") == len(projections)
    assert all(node.input[1] in dequantized for node in projections)
    decoder = onnx.load(str(int8_bundle / "onnx" / "int8" / "decoder.onnx"))
    layers = json.loads((int8_bundle / "manifest.json").read_text())["shapes"]["layers"]
    constants = {init.name: init for init in decoder.graph.initializer}
    dequantize = [node for node in decoder.graph.node if node.op_type == "DequantizeLinear"]
    assert not [node for node in decoder.graph.node if node.op_type == "QuantizeLinear"]
    assert len(dequantize) == 7 * layers
    assert all(constants[node.input[0]].data_type == onnx.TensorProto.INT8 for node in dequantize)
    assert all(len(constants[node.input[1]].dims) == 1 for node in dequantize)  # one scale per output channel
    producers = {output: node.op_type for node in decoder.graph.node for output in node.output}
    lm_head = [n for n in decoder.graph.node if n.op_type == "MatMul" and "lm_head" in n.name]
    assert lm_head and all(producers.get(name) != "DequantizeLinear" for name in lm_head[0].input)


def test_tensorrt_rtx_built_every_graph_fp_and_qdq(int8_bundle, tmp_path):
    """TensorRT's ONNX parser and builder accept every graph we export: fp32 and the Q/DQ versions."""
    from medgemma_xray.engine_build.builder import EngineBuilder, graph_profiles

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


def test_bad_inputs_exit_non_zero_with_a_reason(demo_model_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_optimizer(
        "--model_path", str(demo_model_dir), "--calib_images", str(empty), "--output_path", str(tmp_path / "x")
    )
    assert result.returncode == 2 and "no usable films in --calib_images" in result.stderr  # configuration: exit 2
    assert "refused before any work" in result.stderr
    result = run_optimizer(
        "--model_path", str(tmp_path), "--calib_images", str(empty), "--output_path", str(tmp_path / "y")
    )
    assert result.returncode == 2 and "not a model directory" in result.stderr


def test_onnx_only_bundle_can_be_finished_later(fp32_bundle, tmp_path):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    bundle = tmp_path / "finish"
    shutil.copytree(fp32_bundle, bundle)
    assert json.loads((bundle / "manifest.json").read_text())["graphs"]["decoder"]["engine"] is None
    result = run_optimizer("--from_onnx", str(bundle), "--target", "tensorrt-rtx", "--workspace_gib", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["graphs"]["decoder"]["engine"] == "engines/decoder.plan"
    assert (bundle / "engines" / "decoder.plan").is_file()
    # The real commands, in order; the accuracy record says the new plans were not the ones measured.
    assert "--from_onnx" in manifest["build"]["command"] and "--target tensorrt-rtx" in manifest["build"]["command"]
    assert "--target none" in manifest["build"]["commands"][0] and len(manifest["build"]["commands"]) == 2
    assert manifest["accuracy"]["plans_verified"] is False and manifest["accuracy"]["passed"] is True
    assert manifest["accuracy"]["executor"] == "onnxruntime-cpu"  # what the figures belong to
    assert sorted(p.name for p in tmp_path.iterdir()) == ["finish"]  # replaced atomically: no staging left
    TRTInference(bundle, executor="onnxruntime-cpu").close()  # the re-sealed bundle verifies on ONNX Runtime
    # ... but its plans were never run: the TensorRT executor refuses them without the operator's override
    # (the runtime once read only `passed`, and would have served them as verified).
    from medgemma_xray.trt_inference.trt_model import UnverifiedExecutorError

    with pytest.raises(UnverifiedExecutorError, match="plans_verified: False"):
        TRTInference(bundle, executor="tensorrt")
    assert "engines/decoder.plan" in manifest["integrity"]["files"]
