"""The real TensorRTExecutor against two stand-ins: TensorRT's runtime API running the bundle's own ONNX graphs in
ONNX Runtime (profiles enforced, every address required), and CUDA's runtime over NaN-filled, bounds-checked host
memory. It must match the ONNX Runtime executor token for token and free everything it allocated."""

from __future__ import annotations

import inspect
import logging
import time

import numpy as np
import pytest

from devtools.trt_standins.bundle import installed, make_standin_bundle
from devtools.trt_standins.cuda_host import HostCudaRuntime, HostMemory
from devtools.trt_standins.scenarios import (
    feed_tokens,
    past_the_window_request,
    truncate_then_continue,
    two_turn_requests,
)
from devtools.trt_standins.tensorrt_runtime import IExecutionContext, tensorrt_module
from medgemma_xray.engine_build.comparison import Comparator
from medgemma_xray.inference_api.errors import NoFreeSlotError
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def film():
    return model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=42), 8))))


@pytest.fixture(scope="module")
def standin_bundle(fp32_bundle, tmp_path_factory):
    return make_standin_bundle(fp32_bundle, tmp_path_factory.mktemp("standin") / "bundle", "Host stand-in", "9.0")


@pytest.fixture()
def cuda():
    return HostCudaRuntime()


@pytest.fixture()
def standins(cuda):
    with installed(tensorrt_module(HostMemory(cuda)), cuda.as_module()):
        yield cuda


def open_bundle(bundle, executor, **kwargs):
    """The stand-in plans are the bundle's own ONNX graphs, but no build ran them (plans_verified: false): the
    TensorRT executor opens them only under the operator's override, as on a GPU host."""
    from medgemma_xray.trt_inference.trt_model import TRTInference

    kwargs.setdefault("allow_unverified_plans", executor == "tensorrt")
    return TRTInference(bundle, executor=executor, **kwargs)


def test_conversations_match_onnxruntime_token_for_token_and_everything_is_freed(standin_bundle, standins, film):
    cuda = standins
    reference = open_bundle(standin_bundle, "onnxruntime-cpu")
    engine = open_bundle(standin_bundle, "tensorrt")
    assert engine.info().executor == "tensorrt" and cuda.live_device > 0 and cuda.live_streams == 1
    long_request = past_the_window_request(film, tokens=16)
    assert reference.prompt_ids(long_request).shape[1] > 512 + 50  # past the demo's sliding window
    requests = [*two_turn_requests(reference, film, tokens=16), long_request]
    runs = Comparator.run({"onnxruntime-cpu": reference, "tensorrt": engine}, requests)
    assert Comparator.identical(runs["onnxruntime-cpu"], runs["tensorrt"]) == []
    lengths = [len(steps) for steps in runs["tensorrt"].steps]
    assert lengths == [len(steps) for steps in runs["onnxruntime-cpu"].steps] and all(0 < n <= 16 for n in lengths)
    figures = Comparator.compare_accuracy(runs["onnxruntime-cpu"], runs["tensorrt"], tokens=16)
    assert figures["logprob_delta_max"] < 1e-4 and figures["image_embedding_cosine_min"] > 0.99999
    assert cuda.bytes_copied > 0
    engine.close()
    reference.close()
    assert (cuda.live_device, cuda.live_host, cuda.live_streams) == (0, 0, 0)
    assert cuda.mallocs == cuda.frees


EXECUTOR_METHODS = ("vision", "embed", "new_sequence", "close")
SEQUENCE_METHODS = ("run", "truncate", "close")


@pytest.mark.parametrize("executor", ["tensorrt", "onnxruntime-cpu"])
def test_both_executors_follow_the_written_protocol(standin_bundle, standins, executor):
    """TRTInference holds its executor as executor_protocol.Executor (mypy checks both classes where they are
    opened); here real instances of both, each method with the parameters the protocol names. Batched decoding is
    ONNX Runtime's alone, and only there does TRTInference hand the executor every running sequence at once."""
    from medgemma_xray.trt_inference.runtime.executor_protocol import BatchDecoder, Executor, ExecutorSequence

    backend = open_bundle(standin_bundle, executor)
    try:
        sequence = backend.executor.new_sequence(timeout_s=0)
        checks = ((backend.executor, Executor, EXECUTOR_METHODS), (sequence, ExecutorSequence, SEQUENCE_METHODS))
        for instance, protocol, methods in checks:
            assert isinstance(instance, protocol), f"{type(instance).__name__} lacks a member of {protocol.__name__}"
            for method in methods:
                written = list(inspect.signature(getattr(protocol, method)).parameters)
                actual = list(inspect.signature(getattr(type(instance), method)).parameters)
                assert actual == written, f"{type(instance).__name__}.{method}{actual}: the protocol says {written}"
        sequence.close()
        batched = executor == "onnxruntime-cpu"
        assert isinstance(backend.executor, BatchDecoder) == batched
        assert (backend.max_batch == 2) == batched and backend.max_batch >= 1  # 2: the default sequence slots
    finally:
        backend.close()


@pytest.mark.parametrize("executor", ["tensorrt", "onnxruntime-cpu"])
def test_truncate_keeps_exactly_the_first_tokens(standin_bundle, standins, executor):
    backend = open_bundle(standin_bundle, executor)
    try:
        prompt, tail = list(range(10, 60)), list(range(100, 112))
        for keep in (0, 20, 55):
            assert truncate_then_continue(backend.executor, 512, prompt, tail, keep) < 1e-5
        sequence = backend.executor.new_sequence(timeout_s=0)
        with pytest.raises(ValueError, match="cannot truncate a cache of 0 tokens to 3"):
            sequence.truncate(3)
        sequence.close()
        sequence.close()  # idempotent: the slot is given back once
        assert backend.executor.slots.free == backend.executor.slots.capacity
    finally:
        backend.close()


@pytest.mark.parametrize("executor", ["tensorrt", "onnxruntime-cpu"])
def test_a_long_cache_truncated_short_takes_a_long_prefill_again(standin_bundle, standins, executor):
    """The cache's capacity follows a truncation down: a 1,500-token prefill after truncating a 1,520-token cache
    to 10 tokens fits the slot's mask buffers (keys = capacity + new) and matches a fresh sequence."""
    backend = open_bundle(standin_bundle, executor)
    try:
        prompt, tail = [10 + index % 900 for index in range(1500)], list(range(100, 120))
        assert truncate_then_continue(backend.executor, 512, prompt, tail, 10) < 1e-4
    finally:
        backend.close()


@pytest.mark.parametrize("executor", ["tensorrt", "onnxruntime-cpu"])
def test_no_free_slot_raises_after_the_timeout(standin_bundle, standins, executor):
    backend = open_bundle(standin_bundle, executor, sequence_slots=1)
    try:
        held = backend.executor.new_sequence(timeout_s=0)
        started = time.monotonic()
        with pytest.raises(NoFreeSlotError, match="all 1 decoder slots are in use"):
            backend.executor.new_sequence(timeout_s=0.3)
        assert 0.3 <= time.monotonic() - started < 20  # a wait that ignored timeout_s would last the default, 30 s
        held.close()
        backend.executor.new_sequence(timeout_s=0).close()
    finally:
        backend.close()


def test_vision_batches_above_max_batch_are_split(standin_bundle, standins, film):
    engine = open_bundle(standin_bundle, "tensorrt")
    reference = open_bundle(standin_bundle, "onnxruntime-cpu")
    try:
        assert engine.executor.max_batch == 2
        films = [film.rotate(angle) for angle in (0, 3, 6, 9, 12)]
        features = engine.image_features(films)
        assert features.shape[0] == 5 and engine.executor.vision_context.executions == 3  # 2 + 2 + 1
        assert np.abs(features - reference.image_features(films)).max() < 1e-5
    finally:
        engine.close()
        reference.close()


def test_a_refused_tensor_address_is_an_error_naming_the_tensor(standin_bundle, standins, monkeypatch):
    engine = open_bundle(standin_bundle, "tensorrt")
    original = IExecutionContext.set_tensor_address

    def refuse_logits(self, name, address):
        return False if name == "logits" else original(self, name, address)

    monkeypatch.setattr(IExecutionContext, "set_tensor_address", refuse_logits)
    try:
        from medgemma_xray.trt_inference.runtime.tensorrt_executor import EngineExecutionError

        sequence = engine.executor.new_sequence(timeout_s=0)
        with pytest.raises(EngineExecutionError, match="refused the address of output logits"):
            feed_tokens(engine.executor, sequence, [5, 6, 7], 0, 512, [-1])
        sequence.close()
    finally:
        engine.close()


@pytest.mark.parametrize("failing_allocation", [0, 5, 30])
def test_a_construction_that_fails_part_way_frees_what_it_allocated(standin_bundle, standins, failing_allocation):
    cuda = standins
    cuda.fail_malloc_after = failing_allocation
    with pytest.raises(RuntimeError, match="cudaErrorMemoryAllocation"):
        open_bundle(standin_bundle, "tensorrt")
    assert cuda.mallocs >= failing_allocation
    assert (cuda.live_device, cuda.live_host, cuda.live_streams) == (0, 0, 0)


def test_a_plan_with_other_io_is_refused_at_load(standin_bundle, standins, tmp_path):
    import shutil

    from medgemma_xray.engine_bundle.integrity import seal
    from medgemma_xray.engine_bundle.manifest import read_manifest, write_manifest
    from medgemma_xray.trt_inference.runtime.tensorrt_executor import EngineLoadError

    bundle = tmp_path / "swapped"
    shutil.copytree(standin_bundle, bundle)
    manifest = read_manifest(bundle)
    manifest["graphs"]["decoder"]["engine"] = manifest["graphs"]["vision"]["engine"]
    write_manifest(bundle, seal(bundle, manifest))
    with pytest.raises(EngineLoadError, match=r"decoder.*missing \['full_mask'"):
        open_bundle(bundle, "tensorrt")
    assert (standins.live_device, standins.live_host, standins.live_streams) == (0, 0, 0)


def test_auto_logs_why_it_chose_the_cpu(standin_bundle, fp32_bundle, caplog):
    caplog.set_level(logging.INFO, logger="medgemma_xray.trt_inference.trt_model")
    open_bundle(fp32_bundle, "auto").close()
    assert "chose onnxruntime-cpu because no TensorRT plans in this bundle" in caplog.text
    caplog.clear()
    open_bundle(standin_bundle, "auto").close()  # plans, but no tensorrt module on this host
    assert (
        "chose onnxruntime-cpu because the TensorRT plans cannot run here: the tensorrt package is not installed"
        in (caplog.text)
    )
    caplog.clear()
    broken = HostCudaRuntime()
    module = broken.as_module()
    module.cudaGetDeviceProperties = lambda device: (module.cudaError_t.cudaErrorInvalidValue,)
    with installed(tensorrt_module(HostMemory(broken)), module):
        backend = open_bundle(standin_bundle, "auto")
        assert backend.info().executor == "onnxruntime-cpu"
        backend.close()
    assert (
        "chose onnxruntime-cpu because the TensorRT plans cannot run here: cuda-python found no usable" in caplog.text
    )


def test_unverified_plans_on_tensorrt_are_refused_and_served_marked_with_the_override(standin_bundle, standins):
    from medgemma_xray.trt_inference.trt_model import UnverifiedExecutorError

    with pytest.raises(UnverifiedExecutorError, match="plans_verified: False"):
        open_bundle(standin_bundle, "tensorrt", allow_unverified_plans=False)
    with pytest.raises(UnverifiedExecutorError):
        open_bundle(standin_bundle, "auto", allow_unverified_plans=False)  # auto picks the plans here: same rule
    backend = open_bundle(standin_bundle, "tensorrt")
    info = backend.info()
    assert info.executor == "tensorrt" and info.mode_label == "TensorRT [accuracy not verified on this executor]"
    assert info.engine_summary == "FP32, executor tensorrt; accuracy not verified on this executor"
    backend.close()
