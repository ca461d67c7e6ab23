"""The F1 gate on the trained demo model: its INT8 bundle reads held-out phantoms as PyTorch does, and a broken
quantisation that every other threshold is told to let through is refused on macro-F1 alone."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from medgemma_xray.demo_model.install import TRAINED_CHECKPOINT_DIR
from medgemma_xray.phantoms.findings import FINDINGS
from tests.conftest import run_optimizer
from tests.engine_build.test_build_safety import snapshot

pytestmark = pytest.mark.slow
TASK_PHANTOMS = 4  # x 8 findings x 2 backends; the CLI's default is 24
SHAPES = ("--max_seq_len", "512", "--max_batch", "2", "--verify_tokens", "4")
LET_ANY_FIGURE_THROUGH = {
    "min_cosine": -1.0,
    "min_token_agreement": 0.0,
    "min_long_token_agreement": 0.0,
    "min_long_top1_agreement": 0.0,
    "max_logprob_delta": 1e9,
    "max_kl": 1e9,
    "max_long_kl": 1e9,
}


@pytest.fixture(scope="module")
def trained_int8(tmp_path_factory, synthetic_films):
    out = tmp_path_factory.mktemp("task-gate") / "trained-int8"
    result = run_optimizer(
        *("--model_path", str(TRAINED_CHECKPOINT_DIR), "--calib_images", str(synthetic_films)),
        *("--output_path", str(out), "--precision", "int8", "--target", "none", "--allow_few_films", *SHAPES),
        *("--task_phantoms", str(TASK_PHANTOMS)),
    )
    assert result.returncode == 0, result.stderr[-6000:]
    return out, result.stdout, result.stderr


def test_the_int8_bundle_of_the_trained_model_passes_the_f1_gate(trained_int8):
    bundle, stdout, stderr = trained_int8
    accuracy = json.loads((bundle / "manifest.json").read_text())["accuracy"]
    task = accuracy["task_accuracy"]
    assert task["enabled"] and task["passed"] and task["failures"] == []
    assert task["phantoms"] == TASK_PHANTOMS and task["seeds"] == [900_000, 900_000 + TASK_PHANTOMS - 1]
    assert task["pytorch"]["macro_f1"] > 0.8, "the reference must read phantoms, or passing proves little"
    assert task["macro_f1_drop"] <= accuracy["thresholds"]["max_macro_f1_drop"] == 0.01
    for name in ("pytorch", "bundle"):
        assert sorted(task[name]["per_finding"]) == sorted(FINDINGS) and 0 <= task[name]["ece"] <= 1
        assert "answers" not in task[name]  # the manifest keeps the figures, not every answer
    assert f"task accuracy on {TASK_PHANTOMS} held-out phantoms" in stdout
    assert "| finding | support | F1 PyTorch | F1 bundle |" in stdout and "| **macro-F1** |" in stdout
    # The F1 gate's progress, phantom by phantom, for each backend (it takes minutes on a CPU).
    for name in ("pytorch", "bundle"):
        assert f"F1 gate, {name}: 100%" in stderr and f"{TASK_PHANTOMS}/{TASK_PHANTOMS}" in stderr


def zero_vision_scales(path):
    """Every INT8 weight scale of the vision graph set to zero (a quantiser that lost its scales): SigLIP's
    projections then output only their biases, and the language model no longer sees the film."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    hits = [i for i in model.graph.initializer if i.name.endswith("/weight_int8/scale")]
    assert hits, [i.name for i in model.graph.initializer if i.name.endswith("scale")]
    for hit in hits:
        hit.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(hit)), hit.name))
    onnx.save(model, str(path))


def test_a_broken_quantisation_is_refused_on_macro_f1_and_the_bundle_left_alone(
    trained_int8, synthetic_films, tmp_path, monkeypatch
):
    import medgemma_xray.engine_build.quantize
    from medgemma_xray.engine_build.pipeline import BuildOptions, build_bundle
    from medgemma_xray.engine_build.verify import AccuracyError

    previous = tmp_path / "out" / "bundle"
    shutil.copytree(trained_int8[0], previous)
    before = snapshot(previous)
    real_quantize = medgemma_xray.engine_build.quantize.quantize_graph

    def quantize_then_break(graph, source, target, *args, **kwargs):
        real_quantize(graph, source, target, *args, **kwargs)
        if graph == "vision":
            zero_vision_scales(target)
        return target

    monkeypatch.setattr(medgemma_xray.engine_build.quantize, "quantize_graph", quantize_then_break)
    options = BuildOptions(
        model_path=TRAINED_CHECKPOINT_DIR,
        calib_images=synthetic_films,
        output_path=previous,
        target="none",
        max_seq_len=512,
        max_batch=2,
        verify_tokens=4,
        overwrite=True,
        allow_few_films=True,
        thresholds=LET_ANY_FIGURE_THROUGH,  # only the F1 gate is left to refuse it
        task_phantoms=TASK_PHANTOMS,
    )
    with pytest.raises(AccuracyError) as refused:
        build_bundle(options)
    message = str(refused.value)
    dropped = re.search(r"macro-F1 dropped ([\d.]+) points \(([\d.]+) -> ([\d.]+)\)", message)
    assert dropped, message
    assert float(dropped.group(1)) > 30 and float(dropped.group(2)) > 80, message  # degraded for real
    assert f"on {TASK_PHANTOMS} held-out phantoms" in message and "--calibration_method entropy" in message
    assert "image embedding cosine" not in message and "left as it was" in message
    assert snapshot(previous) == before
    assert [p.name for p in previous.parent.iterdir()] == ["bundle"]  # no staging folder left behind


def test_task_phantoms_0_switches_the_gate_off_and_says_so():
    from medgemma_xray.engine_build.task_gate import measure_task_accuracy

    record = measure_task_accuracy(None, None, phantoms=0, start_seed=900_000, max_drop=0.01)
    assert record["enabled"] is False and record["passed"] is True
    assert "--task_phantoms 0" in record["note"] and "not on whether its answers are right" in record["note"]


def test_asking_a_phantoms_questions_as_one_case_gives_the_same_answers(trained_int8):
    """The gate encodes each film once (share_film_prefix); the contract promises the answers do not change."""
    from medgemma_xray.phantoms.evaluation import held_out_phantoms, task_accuracy
    from medgemma_xray.trt_inference.trt_model import TRTInference

    phantoms = held_out_phantoms(2, 900_000)
    bundle = TRTInference(trained_int8[0], executor="onnxruntime-cpu")
    try:
        shared, separate = (
            task_accuracy(bundle, phantoms, max_new_tokens=4, share_film_prefix=s) for s in (True, False)
        )
    finally:
        bundle.close()
    assert [a["answer"] for a in shared["answers"]] == [a["answer"] for a in separate["answers"]]
    assert shared["ece"] == pytest.approx(separate["ece"], abs=1e-5)
