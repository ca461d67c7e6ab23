"""A decode step writes only the new KV rows (bundle format 2): the exported decoder returns the new tokens' rows,
and the ONNX Runtime executor reads the past where its preallocated buffers keep it and appends one row a step.
A format-1 bundle (whose decoder copied the whole past into its output every step) is refused with the rebuild
command. Checked by shapes and buffer identity, never by timing."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from medgemma_xray.engine_bundle.kv_layout import KV_BLOCK, capacity_for, masks_over_capacity
from medgemma_xray.engine_bundle.manifest import ManifestError
from medgemma_xray.engine_bundle.masks import MASKED, attention_masks
from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.trt_inference.runtime.kv_store import KvStore
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image


def test_growing_the_capacity_in_place_keeps_every_kept_row():
    store = KvStore(tensors=2, max_batch=3, kv_heads=2, head_dim=4, max_rows=300)
    store.reshape(3, KV_BLOCK)
    rows = np.arange(3 * 2 * 50 * 4, dtype=np.float32).reshape(3, 2, 50, 4)
    for view in store.views():
        view[:, :, :50] = rows
    buffers = [id(flat) for flat in store.flat]
    store.reshape(3, capacity_for(KV_BLOCK + 1, 300), keep=50)
    assert store.capacity == 2 * KV_BLOCK
    for view in store.views():
        assert view.shape == (3, 2, 2 * KV_BLOCK, 4)
        np.testing.assert_array_equal(view[:, :, :50], rows)
    store.reshape(3, KV_BLOCK, keep=50)  # and back: blocks move the other way
    for view in store.views():
        np.testing.assert_array_equal(view[:, :, :50], rows)
    assert [id(flat) for flat in store.flat] == buffers  # the same buffers throughout
    assert capacity_for(300, 300) == 300  # never past the cache's rows
    with pytest.raises(ValueError, match="exceed"):
        capacity_for(301, 300)


def test_a_compact_mask_is_spread_over_the_capacity_with_the_unused_rows_masked():
    full, _ = attention_masks(np.asarray([[3]]), np.asarray([[-1, 0, 1, 2, 3]]), 512)
    spread = masks_over_capacity(full, length=4, capacity=6)
    assert spread.shape == (1, 1, 1, 7)
    np.testing.assert_array_equal(spread[..., :4], full[..., :4])  # the cache's rows: dead slot, then tokens 0-2
    assert (spread[..., 4:6] == MASKED).all()  # rows not in use
    assert spread[0, 0, 0, 6] == 0.0  # the new token sees itself


slow = pytest.mark.slow  # these build (or share) the fp32 bundle


@pytest.fixture(scope="module")
def engine(fp32_bundle):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    backend = TRTInference(fp32_bundle, executor="onnxruntime-cpu", sequence_slots=3)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def requests():
    films = [model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in range(3)]
    questions = ("Findings?", "Is the heart enlarged?", "Any pleural effusion on the left side?")
    return [
        GenerationRequest(f, (ChatTurn("user", q),), max_new_tokens=8) for f, q in zip(films, questions, strict=True)
    ]


@slow
def test_the_exported_decoder_returns_only_the_new_tokens_rows(fp32_bundle):
    import onnx
    import onnxruntime as ort

    from medgemma_xray.engine_bundle.manifest import read_manifest

    manifest = read_manifest(fp32_bundle)
    path = fp32_bundle / manifest["graphs"]["decoder"]["onnx"]
    graph = onnx.load(str(path), load_external_data=False).graph
    new_tokens = graph.input[0].type.tensor_type.shape.dim[1].dim_param  # inputs_embeds (batch, new, hidden)
    presents = [output for output in graph.output if output.name.startswith("present_")]
    assert presents and all(p.type.tensor_type.shape.dim[2].dim_param == new_tokens for p in presents)

    shapes = manifest["shapes"]
    capacity, kv = 70, (shapes["kv_heads"], shapes["head_dim"])
    full, sliding = attention_masks(np.asarray([[40]]), np.concatenate([[-1], np.arange(41)])[None], 512)
    feeds = {
        "inputs_embeds": np.zeros((1, 1, shapes["hidden"]), np.float32),
        "position_ids": np.asarray([[40]]),
        "full_mask": masks_over_capacity(full, 41, capacity),
        "sliding_mask": masks_over_capacity(sliding, 41, capacity),
    }
    for name in (i.name for i in graph.input if i.name.startswith("past_")):
        feeds[name] = np.zeros((1, kv[0], capacity, kv[1]), np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    assert all(outputs[p.name].shape == (1, kv[0], 1, kv[1]) for p in presents)  # one new row, not 1 + 70


@slow
def test_a_step_reads_the_past_where_the_slot_keeps_it_and_appends_one_row(engine, requests):
    generation = engine.start(requests[0])
    try:
        engine.prepare_images([generation])
        assert engine.prefill(generation)
        sequence = generation.conversation.kv
        store, executor = sequence.store, engine.executor
        buffers = list(store.flat)
        past = sequence.past_length
        query = np.asarray([[past]])
        full, sliding = attention_masks(query, np.concatenate([[-1], np.arange(past + 1)])[None], 512)
        embeds = executor.embed(np.asarray([[generation.pending]]))
        feeds = sequence.decoder_feeds(embeds, query, full, sliding)
        for name, flat in zip(executor.kv_input_names, buffers, strict=True):
            assert feeds[name].ctypes.data == flat.ctypes.data and np.shares_memory(feeds[name], flat)
            assert feeds[name].shape[2] == store.capacity >= past + 1
        small = {name: value for name, value in feeds.items() if not name.startswith("past_")}
        _, presents = executor.run_decoder(store, small)
        assert all(p.shape == (1, executor.kv_heads, 1, executor.head_dim) for p in presents)
        sequence.run(embeds, query, full, sliding)
        assert sequence.past_length == past + 1
        assert all(a is b for a, b in zip(store.flat, buffers, strict=True))  # no new cache: rows written in
        for view, row in zip(store.views(), presents, strict=True):
            np.testing.assert_array_equal(view[:, :, past + 1 : past + 2], row)
    finally:
        engine.finish(generation, cancelled=True)


@slow
def test_a_running_batch_appends_to_its_store_and_gives_each_sequence_its_rows_back(engine, requests):
    generations = [engine.start(request) for request in requests]
    try:
        engine.prepare_images(generations)
        for generation in generations:
            assert engine.prefill(generation)
        sequences = [g.conversation.kv for g in generations]
        pasts = [s.past_length for s in sequences]
        executor = engine.executor
        tokens = np.asarray([[g.pending] for g in generations])
        executor.decode_batch(sequences, executor.embed(tokens), engine.sliding_window)
        buffers, batch = list(executor.batch_store.flat), executor._batch
        for step in range(2, 4):
            executor.decode_batch(sequences, executor.embed(tokens), engine.sliding_window)
            assert executor._batch is batch and all(
                a is b for a, b in zip(executor.batch_store.flat, buffers, strict=True)
            )
            assert batch.length == max(pasts) + 1 + step  # one row a step, for every member
        assert [s.past_length for s in sequences] == [p + 3 for p in pasts]
        sequences[1].truncate(pasts[1])  # used alone: its rows come back compact, then it rewinds
        assert sequences[1].batch is None and sequences[1].length == pasts[1] + 1
    finally:
        for generation in generations:
            engine.finish(generation, cancelled=True)


@slow
def test_a_format_1_bundle_is_refused_with_the_command_that_rebuilds_it(fp32_bundle, tmp_path):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    copy = tmp_path / "bundle"
    shutil.copytree(fp32_bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format"] = 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as refused:
        TRTInference(copy, executor="onnxruntime-cpu")
    message = str(refused.value)
    assert "bundle format 1 is not 2" in message and "copies the whole KV past" in message
    assert "optimize_trt_engine.py" in message and "--overwrite" in message
