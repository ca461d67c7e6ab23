"""Operator scripts against real servers and engine bundles: every status surface names the executor that runs, a
bundle serves only the model PyTorch serves and only on an executor its accuracy was measured on (or marked so
under the operator's override), and configuration errors exit 2 so systemd does not restart in a loop."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request

import pytest
from gradio_client import Client

from medgemma_xray.serving.exit_codes import BAD_CONFIGURATION
from tests.conftest import free_port
from tests.scripts.harness import Operator

pytestmark = pytest.mark.slow
ONNX_ONLY = "Engine bundle on onnxruntime-cpu, not TensorRT (no TensorRT plans in this bundle)"


def metrics(op: Operator) -> str:
    return urllib.request.urlopen(f"{op.url}/metrics", timeout=10).read().decode()


def badge(op: Operator) -> str:
    return Client(op.url, verbose=False).predict(api_name="/model_badge")


def reseal(bundle, change) -> None:
    from medgemma_xray.engine_bundle.integrity import seal
    from medgemma_xray.engine_bundle.manifest import read_manifest, write_manifest

    manifest = read_manifest(bundle)
    change(manifest)
    write_manifest(bundle, seal(bundle, manifest))


def test_switch_to_trt_on_an_onnx_only_bundle_names_the_executor_everywhere(tmp_path, fp32_bundle):
    op = Operator(tmp_path / "logs", free_port(), MAX_NEW_TOKENS="4")
    try:
        assert op.run("start_gradio.sh", "--engine_path", str(fp32_bundle)).returncode == 0
        switched = op.run("switch_to_trt.sh")
        assert switched.returncode == 0, switched.stderr
        assert f"Inference Mode: {ONNX_ONLY}" in switched.stdout
        assert (
            "TRT Engine: Loaded (FP32, executor onnxruntime-cpu: no TensorRT plans in this bundle)" in switched.stdout
        )
        status = op.run("status_gradio.sh").stdout
        assert f"Inference Mode: {ONNX_ONLY}" in status and f"Last switch: PyTorch -> {ONNX_ONLY}" in status
        assert "TRT Engine: Loaded (FP32, executor onnxruntime-cpu: no TensorRT plans in this bundle)" in status
        assert "Engine accuracy measured on: the bundle's ONNX graphs in ONNX Runtime on the CPU" in status
        assert "Inference Mode: TensorRT" not in status + switched.stdout
        assert op.status_json()["mode_label"] == ONNX_ONLY
        assert f"**Mode:** {ONNX_ONLY}" in badge(op)
        exposition = metrics(op)
        assert re.search(
            r'^medgemma_backend_info\{accuracy_verified="true",executor="onnxruntime-cpu",mode="engine-bundle",'
            r'precision="fp32",thresholds_lowered="false"\} 1\.0$',
            exposition,
            re.M,
        ), exposition
        assert 'mode="trt"' not in exposition and 'model_name="trt"' not in exposition
        log = (op.log_dir / "gradio_app.log").read_text()
        assert "with executor onnxruntime-cpu: no TensorRT plans in this bundle" in log
        assert f"switched PyTorch -> {ONNX_ONLY}" in log
        back = op.run("switch_to_pytorch.sh")
        assert back.returncode == 0 and "Inference Mode: PyTorch" in back.stdout
        assert re.search(r'^medgemma_backend_info\{[^}]*executor="transformers",mode="pytorch"', metrics(op), re.M)
        assert 'executor="onnxruntime-cpu"' not in metrics(op)  # one series: what serves now
    finally:
        op.cleanup()


def test_a_bundle_of_another_checkpoint_is_refused_at_start_and_at_switch(tmp_path, fp32_bundle, random_model_dir):
    """fp32_bundle is built from the trained demo checkpoint; this server's PyTorch model is the random one."""
    op = Operator(tmp_path / "logs", free_port(), MODEL_PATH=str(random_model_dir))
    try:
        start = op.run("start_gradio.sh", "--mode", "trt", "--engine_path", str(fp32_bundle))
        log = (op.log_dir / "gradio_app.log").read_text()
        assert start.returncode == BAD_CONFIGURATION, start.stderr
        assert f"was built from another model than this server's PyTorch model {random_model_dir}" in log
        assert "bundle from medgemma-xray-demo" in log
        assert "Rebuild the bundle from the served model: python optimize_trt_engine.py" in log
        assert not op.servers()

        assert op.run("start_gradio.sh", "--engine_path", str(fp32_bundle)).returncode == 0
        switched = op.run("switch_to_trt.sh")
        assert switched.returncode == 1
        assert f"another model than this server's PyTorch model {random_model_dir}" in switched.stderr
        assert "Inference Mode still: PyTorch" in switched.stderr
        status = op.run("status_gradio.sh").stdout
        assert "Inference Mode: PyTorch" in status and "TRT Engine: Failed (" in status
        assert op.status_json()["mode"] == "pytorch"
    finally:
        op.cleanup()


@pytest.fixture()
def verified_on_plans_only(int8_bundle, tmp_path):
    """The INT8 bundle as a TensorRT-RTX host would have built it: its gate ran on the plans (an RTX 4090), so its
    figures say nothing about ONNX Runtime, which is all that can run it here."""
    bundle = tmp_path / "rtx-verified"
    shutil.copytree(int8_bundle, bundle)
    reseal(
        bundle,
        lambda m: m["accuracy"].update(
            executor="tensorrt", plans_verified=True, measured_on="the built plans, on this host's RTX 4090"
        ),
    )
    return bundle


def test_an_executor_the_accuracy_was_not_measured_on_needs_the_override_and_says_so(tmp_path, verified_on_plans_only):
    op = Operator(tmp_path / "logs", free_port(), MAX_NEW_TOKENS="4")
    try:
        refused = op.run("start_gradio.sh", "--mode", "trt", "--engine_path", str(verified_on_plans_only))
        assert refused.returncode == BAD_CONFIGURATION, refused.stderr
        log = (op.log_dir / "gradio_app.log").read_text()
        assert "its figures were measured on tensorrt, not on onnxruntime-cpu" in log
        assert "ALLOW_UNVERIFIED_PLANS=1" in log

        op.env["ALLOW_UNVERIFIED_PLANS"] = "1"
        started = op.run("start_gradio.sh", "--mode", "trt", "--engine_path", str(verified_on_plans_only))
        assert started.returncode == 0, started.stderr
        status = op.run("status_gradio.sh").stdout
        assert "[accuracy not verified on this executor]" in status.splitlines()[3]  # the Inference Mode line
        assert "TRT Engine: Loaded (INT8, executor onnxruntime-cpu: " in status
        assert "; accuracy not verified on this executor)" in status
        assert (
            "Engine accuracy: accuracy not verified on this executor (its figures were measured on tensorrt" in status
        )
        assert "accuracy not verified on this executor" in badge(op)
        assert re.search(r'^medgemma_backend_info\{accuracy_verified="false",', metrics(op), re.M)
        assert "ACCURACY NOT VERIFIED ON THIS EXECUTOR" in (op.log_dir / "gradio_app.log").read_text()
    finally:
        op.cleanup()


def test_configuration_errors_at_start_exit_2(tmp_path, int8_bundle):
    """Exit 2 is in the unit's RestartPreventExitStatus: systemd stops instead of restarting in a loop."""
    corrupt = tmp_path / "corrupt"
    shutil.copytree(int8_bundle, corrupt)
    (corrupt / "tokenizer.json").write_text("{}")
    resealed = tmp_path / "resealed"  # a truncated graph whose manifest was sealed again: hashes pass, ORT fails
    shutil.copytree(int8_bundle, resealed)
    graph = resealed / "onnx" / "int8" / "decoder.onnx"
    graph.write_bytes(graph.read_bytes()[:4096])
    reseal(resealed, lambda m: None)
    linked = tmp_path / "linked"  # its onnx/ folder a link to another copy
    shutil.copytree(int8_bundle, linked)
    shutil.move(linked / "onnx", tmp_path / "onnx-elsewhere")
    (linked / "onnx").symlink_to(tmp_path / "onnx-elsewhere")
    trt = ("--mode", "trt", "--engine_path")
    cases = {
        "corrupt bundle": ({}, (*trt, str(corrupt)), "tokenizer.json has 2 bytes"),
        "resealed truncated graph": ({}, (*trt, str(resealed)), "ONNX Runtime cannot load"),
        "linked folder": ({}, (*trt, str(linked)), "onnx is a symbolic link"),
        "missing model": ({"MODEL_PATH": str(tmp_path / "no-model")}, (), "is not a model directory"),
    }
    for name, (env, args, message) in cases.items():
        op = Operator(tmp_path / name.replace(" ", "-"), free_port(), **env)
        try:
            result = op.run("start_gradio.sh", *args)
            log = (op.log_dir / "gradio_app.log").read_text()
            assert result.returncode == BAD_CONFIGURATION, (name, result.returncode, result.stderr[-2000:])
            assert message in log, (name, log[-2000:])
        finally:
            op.cleanup()


def test_a_linked_bundle_is_refused_at_a_switch_and_pytorch_keeps_serving(tmp_path, int8_bundle):
    linked = tmp_path / "linked"
    shutil.copytree(int8_bundle, linked)
    shutil.move(linked / "manifest.json", tmp_path / "manifest.json")
    (linked / "manifest.json").symlink_to(tmp_path / "manifest.json")
    op = Operator(tmp_path / "logs", free_port(), MAX_NEW_TOKENS="4")
    try:
        assert op.run("start_gradio.sh", "--engine_path", str(linked)).returncode == 0
        switched = op.run("switch_to_trt.sh")
        assert switched.returncode == 1
        assert "cannot switch to engine bundle: " in switched.stderr
        assert "manifest.json is a symbolic link" in switched.stderr
        assert "Inference Mode still: PyTorch" in switched.stderr
        assert op.status_json()["mode"] == "pytorch"
    finally:
        op.cleanup()


def test_the_service_running_as_another_user_reads_every_file_of_a_bundle(portable_checkout, int8_bundle):
    """The build runs as one user (here root) and the service as another (nobody): every published file, the
    TensorRT plans included, must be readable by it. The bundle is copied with its modes as the build left them."""
    place = portable_checkout.parent / "bundle-for-nobody"
    shutil.copytree(int8_bundle, place)  # copy2: the modes come along
    log_dir = portable_checkout.parent / "nobody-logs"
    log_dir.mkdir()
    shutil.chown(log_dir, "nobody")
    op = Operator(log_dir, free_port(), scripts=portable_checkout / "scripts", MAX_NEW_TOKENS="4")
    try:
        started = op.run("start_gradio.sh", "--mode", "trt", "--engine_path", str(place), user="nobody")
        log = (log_dir / "gradio_app.log").read_text() if (log_dir / "gradio_app.log").exists() else ""
        assert started.returncode == 0, started.stdout + started.stderr + log[-3000:]
        status = op.run("status_gradio.sh").stdout
        assert "Inference Mode: Engine bundle on onnxruntime-cpu, not TensorRT" in status
        assert re.search(r"bundle \S+bundle-for-nobody: accuracy gate passed .*; (\d+) files", log)
    finally:
        op.cleanup()


def test_a_lowered_threshold_shows_on_every_status_surface(tmp_path, int8_bundle):
    """A bundle whose gate passed with --min_long_token_agreement 0.5 (the default is 0.9): the ready state says so
    on status_gradio.sh, /metrics and the badge; its own figures and the unlowered thresholds appear too."""
    lowered = tmp_path / "lowered"
    shutil.copytree(int8_bundle, lowered)
    reseal(lowered, lambda m: m["accuracy"]["thresholds"].update(min_long_token_agreement=0.5))
    long_case = json.loads((lowered / "manifest.json").read_text())["accuracy"]["long_conversation"]
    op = Operator(tmp_path / "logs", free_port(), MAX_NEW_TOKENS="4")
    try:
        started = op.run("start_gradio.sh", "--mode", "trt", "--engine_path", str(lowered))
        assert started.returncode == 0, started.stderr
        status = op.run("status_gradio.sh").stdout
        gate = next(line for line in status.splitlines() if line.startswith("Engine gate: "))
        assert gate.startswith("Engine gate: 1 threshold(s) LOWERED below the default; "), gate
        tokens = long_case["prompt_tokens"]
        assert (
            f"long ({tokens} tokens) greedy agreement {long_case['token_agreement']:.4g} (>= 0.5, LOWERED from the default 0.9)"
            in gate
        )
        assert f"long ({tokens} tokens) top-1 agreement {long_case['top1_agreement']:.4g} (>= 0.9)" in gate
        assert "largest KL" in gate and "F1 gate not run" in gate
        exposition = metrics(op)
        assert re.search(r'^medgemma_backend_info\{[^}]*thresholds_lowered="true"\} 1\.0$', exposition, re.M)
        assert re.search(
            r'^medgemma_engine_gate_threshold\{bound="min",figure="long_token_agreement",lowered="true"\} 0\.5$',
            exposition,
            re.M,
        ), exposition
        assert re.search(
            r'^medgemma_engine_gate_default_threshold\{bound="min",figure="long_token_agreement"\} 0\.9$',
            exposition,
            re.M,
        )
        assert re.search(
            r'^medgemma_engine_gate_threshold\{bound="max",figure="long_kl",lowered="false"\} 0\.05$', exposition, re.M
        )
        value = re.search(r'^medgemma_engine_gate_value\{figure="long_token_agreement"\} (\S+)$', exposition, re.M)
        assert value and float(value.group(1)) == pytest.approx(long_case["token_agreement"])
        shown = badge(op)
        assert "⚠️ **Accuracy gate:** 1 threshold(s) LOWERED below the default" in shown
    finally:
        op.cleanup()
