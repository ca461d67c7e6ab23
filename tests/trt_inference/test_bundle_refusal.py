"""Serving refuses a bundle that is not proven: a failed or missing accuracy gate, an edited manifest, or any file
that is not the one the build hashed. Every refusal names the file and the rebuild command."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import pytest

from medgemma_xray.engine_bundle.integrity import BundleRefusedError
from medgemma_xray.serving.control_cli import format_status

pytestmark = pytest.mark.slow
REBUILD = "Rebuild it: python optimize_trt_engine.py"


def open_bundle(bundle):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    return TRTInference(bundle, executor="onnxruntime-cpu")


@pytest.fixture()
def bundle(int8_bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(int8_bundle, copy)
    return copy


def edit_manifest(bundle, change) -> None:
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def test_an_intact_bundle_serves_and_says_what_its_accuracy_was_measured_on(bundle):
    backend = open_bundle(bundle)
    details = backend.info().details
    assert details["accuracy"]["passed"] is True and details["accuracy"]["executor"] == "onnxruntime-cpu"
    assert details["accuracy_measured_on"].startswith("the bundle's ONNX graphs in ONNX Runtime on the CPU")
    status = {
        "uptime_s": 1,
        "url": "http://127.0.0.1:1",
        "ready": True,
        "mode": "trt",
        "trt_engine": "Loaded",
        "backend": asdict(backend.info()),
        "last_switch": None,
        "queue_depth": 0,
        "breaker": {"state": "closed", "consecutive_failures": 0, "threshold": 5, "trips": 0},
        "requests": {"requests": 0, "errors": 0},
        "latency": {"p50_s": None, "p99_s": None},
        "requests_waiting": 0,
        "requests_running": 0,
    }
    assert "Engine accuracy measured on: the bundle's ONNX graphs in ONNX Runtime" in format_status(status, 1)
    backend.close()


def test_a_failed_accuracy_gate_is_refused(bundle):
    edit_manifest(bundle, lambda m: m["accuracy"].update(passed=False, failures=["token agreement 0.170 < 0.9"]))
    with pytest.raises(BundleRefusedError) as error:
        open_bundle(bundle)
    message = str(error.value)
    assert "failed its accuracy check against PyTorch (token agreement 0.170 < 0.9" in message
    assert "must not answer questions" in message and REBUILD in message and "--overwrite" in message


def test_a_bundle_without_an_accuracy_record_is_refused(bundle):
    edit_manifest(bundle, lambda m: m.pop("accuracy"))
    with pytest.raises(BundleRefusedError, match="has no accuracy record"):
        open_bundle(bundle)


def test_an_edited_manifest_is_refused(bundle):
    edit_manifest(bundle, lambda m: m["model"].update(weights_sha256="0" * 64))
    with pytest.raises(BundleRefusedError, match="was changed after the build sealed it") as error:
        open_bundle(bundle)
    assert REBUILD in str(error.value)


def test_a_changed_plan_is_refused_naming_it(bundle):
    plan = bundle / "engines" / "decoder.plan"
    data = bytearray(plan.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte different
    plan.write_bytes(bytes(data))
    with pytest.raises(BundleRefusedError, match=r"engines/decoder.plan changed since the build") as error:
        open_bundle(bundle)
    assert REBUILD in str(error.value)


def test_a_changed_or_truncated_onnx_graph_is_refused_naming_it(bundle):
    graph = bundle / "onnx" / "int8" / "decoder.onnx"
    data = graph.read_bytes()
    graph.write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleRefusedError, match=r"onnx/int8/decoder.onnx has \d+ bytes, the build recorded"):
        open_bundle(bundle)
    graph.write_bytes(data[:-4] + b"\x00\x00\x00\x00")
    with pytest.raises(BundleRefusedError, match=r"onnx/int8/decoder.onnx changed since the build"):
        open_bundle(bundle)


def test_a_missing_tokenizer_is_refused_naming_it(bundle):
    (bundle / "tokenizer.json").unlink()
    with pytest.raises(BundleRefusedError, match=r"tokenizer.json is missing \(the manifest records it\)") as error:
        open_bundle(bundle)
    assert REBUILD in str(error.value)


def test_a_bundle_from_before_file_hashes_is_refused(bundle):
    edit_manifest(bundle, lambda m: m.pop("integrity"))
    with pytest.raises(BundleRefusedError, match="records no file hashes"):
        open_bundle(bundle)


def reseal(bundle, change) -> None:
    """Edit the manifest and seal it again, as a build (or someone with write access) would: the digest passes."""
    from medgemma_xray.engine_bundle.integrity import seal
    from medgemma_xray.engine_bundle.manifest import read_manifest, write_manifest

    manifest = read_manifest(bundle)
    change(manifest)
    write_manifest(bundle, seal(bundle, manifest))


@pytest.mark.parametrize(
    ("change", "failure"),
    [
        (lambda a: a.update(token_agreement_mean=0.5), "token agreement 0.500 < 0.9"),
        (lambda a: a["long_conversation"].update(token_agreement=0.08), "token agreement 0.080 < 0.9"),
        (lambda a: a.pop("long_conversation"), "the long conversation (>= 1536 tokens) was not measured"),
        (lambda a: a.update(films=2), "measured on 2 held-out films, fewer than the 4 needed to judge"),
        (lambda a: a.pop("thresholds"), "the record holds no thresholds"),
    ],
)
def test_figures_are_checked_against_the_recorded_thresholds_not_only_passed(bundle, change, failure):
    reseal(bundle, lambda m: change(m["accuracy"]))  # passed stays true, the seal is valid
    with pytest.raises(BundleRefusedError, match="do not pass its own recorded thresholds") as error:
        open_bundle(bundle)
    assert failure in str(error.value) and REBUILD in str(error.value)


def test_a_bundle_of_another_checkpoint_is_refused_naming_both_models(bundle, random_model_dir, demo_model_dir):
    from medgemma_xray.engine_bundle.identity import ModelMismatchError
    from medgemma_xray.trt_inference.trt_model import TRTInference

    with pytest.raises(ModelMismatchError) as error:
        TRTInference(bundle, executor="onnxruntime-cpu", served_model=random_model_dir)
    message = str(error.value)
    assert f"was built from another model than this server's PyTorch model {random_model_dir}" in message
    assert "bundle from medgemma-xray-demo" in message and str(demo_model_dir.resolve()) in message
    assert f"--model_path {random_model_dir}" in message and "--overwrite" in message  # how to rebuild
    assert f"set MODEL_PATH to {demo_model_dir.resolve()}" in message
    TRTInference(bundle, executor="onnxruntime-cpu", served_model=demo_model_dir).close()  # its own model: serves


def test_plans_never_run_are_refused_on_tensorrt_unless_the_operator_allows_it(bundle):
    """This bundle's TensorRT-RTX plans were built, never run (plans_verified: false): its figures are ONNX
    Runtime's. On the TensorRT executor it is refused before the plans or the GPU are touched."""
    from medgemma_xray.trt_inference.trt_model import TRTInference, UnverifiedExecutorError

    with pytest.raises(UnverifiedExecutorError) as error:
        TRTInference(bundle, executor="tensorrt")
    message = str(error.value)
    assert "its TensorRT plans were never run against PyTorch (plans_verified: False" in message
    assert "ALLOW_UNVERIFIED_PLANS=1" in message and "accuracy not verified on this executor" in message
    # With the override it goes on to the plans, which need a GPU this host does not have.
    with pytest.raises(Exception) as error:
        TRTInference(bundle, executor="tensorrt", allow_unverified_plans=True)
    assert not isinstance(error.value, UnverifiedExecutorError)
    backend = open_bundle(bundle)  # on ONNX Runtime, the executor its figures were measured on: served
    assert backend.info().unverified_reason == ""
    backend.close()


@pytest.fixture()
def served_copy(demo_model_dir, tmp_path):
    """The demo checkpoint copied, to be edited as an operator might edit the served model."""
    copy = tmp_path / "served-model"
    shutil.copytree(demo_model_dir, copy)
    return copy


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "chat_template.jinja"])
def test_a_served_model_with_an_edited_config_or_tokenizer_is_refused(bundle, served_copy, name):
    """Same weights, another config.json or tokenizer: the bundle and PyTorch would answer differently."""
    from medgemma_xray.engine_bundle.identity import ModelMismatchError
    from medgemma_xray.trt_inference.trt_model import TRTInference

    TRTInference(bundle, executor="onnxruntime-cpu", served_model=served_copy).close()  # unedited: serves
    path = served_copy / name
    path.write_text(path.read_text().replace("\n", "\n ", 1))  # one space: the smallest edit
    with pytest.raises(ModelMismatchError) as error:
        TRTInference(bundle, executor="onnxruntime-cpu", served_model=served_copy)
    message = str(error.value)
    assert f"the weights match, but {name} changed" in message
    assert f"--model_path {served_copy}" in message and "--overwrite" in message


def test_the_rebuild_suggestion_names_the_served_model_when_the_build_took_the_default(bundle, random_model_dir):
    """A bundle built without --model_path (the demo default): the rebuild command still says which model."""
    from medgemma_xray.engine_bundle.identity import ModelMismatchError
    from medgemma_xray.trt_inference.trt_model import TRTInference

    reseal(bundle, lambda m: m["build"].update(commands=["python optimize_trt_engine.py --output_path out"]))
    with pytest.raises(ModelMismatchError) as error:
        TRTInference(bundle, executor="onnxruntime-cpu", served_model=random_model_dir)
    assert f"python optimize_trt_engine.py --model_path {random_model_dir} --output_path out" in str(error.value)


@pytest.mark.parametrize("inside", ["tokenizer.json", "onnx", "manifest.json", "onnx/int8/decoder.onnx"])
def test_a_symbolic_link_anywhere_in_a_bundle_is_refused(bundle, tmp_path, inside):
    """A linked file or folder (even one whose target is byte-identical) or a linked manifest: refused."""
    target = tmp_path / "elsewhere" / inside
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(bundle / inside, target)
    (bundle / inside).symlink_to(target)
    with pytest.raises(BundleRefusedError) as error:
        open_bundle(bundle)
    assert f"{inside} is a symbolic link (to {target})" in str(error.value)


def test_the_bundle_folder_itself_may_be_a_link(bundle, tmp_path):
    """engines/current -> engines/v3: what is inside is plain files, so it serves."""
    current = tmp_path / "current"
    current.symlink_to(bundle)
    open_bundle(current).close()


def test_a_manifest_naming_a_file_outside_the_bundle_is_refused(bundle, tmp_path):
    from medgemma_xray.engine_bundle.integrity import manifest_digest
    from medgemma_xray.engine_bundle.manifest import read_manifest, write_manifest

    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    manifest = read_manifest(bundle)
    manifest["integrity"]["files"]["../outside.json"] = {"sha256": "0" * 64, "bytes": 2}
    manifest["integrity"]["manifest_sha256"] = manifest_digest(manifest)
    write_manifest(bundle, manifest)
    with pytest.raises(BundleRefusedError, match=r"names files outside the bundle \(\.\./outside\.json\)"):
        open_bundle(bundle)


def test_a_truncated_graph_sealed_again_is_a_configuration_error(bundle):
    """The hashes match (sealed again), but ONNX Runtime cannot parse the graph: the same at every restart."""
    from medgemma_xray.engine_bundle.manifest import ManifestError
    from medgemma_xray.serving.exit_codes import BAD_CONFIGURATION, startup_exit_code

    graph = bundle / "onnx" / "int8" / "decoder.onnx"
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    reseal(bundle, lambda m: None)
    with pytest.raises(ManifestError, match=r"ONNX Runtime cannot load .*decoder\.onnx") as error:
        open_bundle(bundle)
    assert "Rebuild the bundle: python optimize_trt_engine.py" in str(error.value)
    assert startup_exit_code(error.value) == BAD_CONFIGURATION


def test_every_published_file_has_one_mode_that_other_users_may_read(int8_bundle):
    """TensorRT plans (written by mkstemp, 0600) included: files 0644, folders 0755."""
    modes = {path.relative_to(int8_bundle).as_posix(): path.stat().st_mode & 0o777 for path in int8_bundle.rglob("*")}
    assert any(name.endswith(".plan") for name in modes), sorted(modes)
    files = {name: oct(mode) for name, mode in modes.items() if (int8_bundle / name).is_file()}
    folders = {name: oct(mode) for name, mode in modes.items() if (int8_bundle / name).is_dir()}
    assert set(files.values()) == {"0o644"}, files
    assert set(folders.values()) == {"0o755"}, folders
    assert int8_bundle.stat().st_mode & 0o777 == 0o755
