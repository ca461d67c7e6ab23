"""--from_onnx where the new plans run here: the gate runs again on the plans before the record says
plans_verified: true. The plans are the TensorRT stand-in's (the bundle's own graphs behind TensorRT's runtime
API, host-memory CUDA): no TensorRT runs on this host, so this checks the gate's path, not TensorRT's numbers."""

from __future__ import annotations

import pytest

from devtools.trt_standins.bundle import installed, make_standin_bundle
from devtools.trt_standins.cuda_host import HostCudaRuntime, HostMemory
from devtools.trt_standins.tensorrt_runtime import tensorrt_module
from medgemma_xray.engine_build.finish import held_out_films, verify_plans
from medgemma_xray.engine_build.pipeline import BuildRefusedError
from medgemma_xray.engine_build.precision import BuildPlan
from medgemma_xray.engine_bundle.integrity import seal
from medgemma_xray.engine_bundle.manifest import read_manifest, write_manifest

pytestmark = pytest.mark.slow


@pytest.fixture()
def standins():
    cuda = HostCudaRuntime()
    with installed(tensorrt_module(HostMemory(cuda)), cuda.as_module()):
        yield cuda


def test_plans_that_run_here_are_gated_before_they_count_as_verified(
    fp32_bundle, demo_model_dir, synthetic_films, tmp_path, standins
):
    from medgemma_xray.trt_inference.trt_model import TRTInference, UnverifiedExecutorError

    bundle = make_standin_bundle(fp32_bundle, tmp_path / "bundle", "Host stand-in", "9.0")
    with pytest.raises(UnverifiedExecutorError):  # as a --from_onnx on a CPU host leaves it
        TRTInference(bundle, executor="tensorrt")
    manifest = read_manifest(bundle)
    with pytest.raises(BuildRefusedError, match="pass --calib_images"):
        held_out_films(manifest, None)
    other = tmp_path / "other-films"
    other.mkdir()
    for path in sorted(synthetic_films.iterdir())[:8]:
        (other / path.name).write_bytes(path.read_bytes())
    with pytest.raises(BuildRefusedError, match="is not the set the bundle was calibrated on"):
        held_out_films(manifest, other)
    held_out = held_out_films(manifest, synthetic_films)
    assert len(held_out) == manifest["calibration"]["held_out"] == 4

    manifest["accuracy"]["task_accuracy"] = {"enabled": False}  # the F1 gate has its own tests; keep this one short
    plan = BuildPlan("fp32", "tensorrt", (), "tensorrt", "the built plans, on this host's Host stand-in")
    record = verify_plans(bundle, manifest, plan, held_out, demo_model_dir, "cpu")
    assert record["executor"] == "tensorrt" and record["plans_verified"] is True and record["passed"] is True
    assert record["films"] == 4 and record["long_conversation"]["prompt_tokens"] >= 1500
    assert record["token_agreement_mean"] >= record["thresholds"]["min_token_agreement"]
    assert record["onnxruntime_figures"]["executor"] == "onnxruntime-cpu"

    manifest["accuracy"] = record
    write_manifest(bundle, seal(bundle, manifest))
    backend = TRTInference(bundle, executor="tensorrt")  # verified on this executor: no override needed
    info = backend.info()
    assert info.unverified_reason == "" and info.mode_label == "TensorRT"
    backend.close()
