"""The engine path decodes every running sequence in one executor call (ONNX Runtime, the fp32 bundle): pasts of
different lengths padded to one with masked keys, per-row positions, and the same result as one at a time."""

from __future__ import annotations

import numpy as np
import pytest

from medgemma_xray.inference_api.types import ChatTurn, GenerationRequest, GenerationStats
from medgemma_xray.phantoms.films import chest_phantom, png_bytes, quantize
from medgemma_xray.xray_io import load_radiograph
from medgemma_xray.xray_io.preprocess import model_input_image

pytestmark = pytest.mark.slow

QUESTIONS = ("Findings?", "Is the heart enlarged?", "Any pleural effusion on the left side, and how large is it?")


@pytest.fixture(scope="module")
def engine(fp32_bundle):
    from medgemma_xray.trt_inference.trt_model import TRTInference

    backend = TRTInference(fp32_bundle, executor="onnxruntime-cpu", sequence_slots=4)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def requests():
    films = [model_input_image(load_radiograph(png_bytes(quantize(chest_phantom(seed=s), 8)))) for s in range(3)]
    return [
        GenerationRequest(film, (ChatTurn("user", question),), max_new_tokens=6 + 3 * index)
        for index, (film, question) in enumerate(zip(films, QUESTIONS, strict=True))
    ]


def test_one_batched_executor_call_gives_each_row_its_lone_logits(engine, requests):
    generations = [engine.start(request) for request in requests]
    try:
        engine.prepare_images(generations)
        for generation in generations:
            assert engine.prefill(generation)
        sequences = [g.conversation.kv for g in generations]
        pasts = [sequence.past_length for sequence in sequences]
        assert len(set(pasts)) == 3  # three different lengths: the batch pads and masks
        tokens = np.asarray([[g.pending] for g in generations], dtype=np.int64)
        batched = engine.executor.decode_batch(sequences, engine.executor.embed(tokens), engine.sliding_window)
        assert [sequence.past_length for sequence in sequences] == [past + 1 for past in pasts]
        for sequence, past, token in zip(sequences, pasts, tokens, strict=True):
            sequence.truncate(past)  # rewind, then the same token alone
            from medgemma_xray.engine_bundle.masks import attention_masks

            query = np.asarray([[past]], dtype=np.int64)
            keys = np.concatenate([[-1], np.arange(past + 1)])[None]
            full, sliding = attention_masks(query, keys, engine.sliding_window)
            alone = sequence.run(engine.executor.embed(token[None]), query, full, sliding)
            assert np.allclose(batched[sequences.index(sequence)], alone[0], atol=1e-4)
    finally:
        for generation in generations:
            engine.finish(generation, cancelled=True)


def test_a_batched_step_gives_each_sequence_its_one_at_a_time_tokens(engine, requests):
    expected = []
    for request in requests:
        stats = GenerationStats()
        engine.generate(request, stats)
        expected.append(stats.token_ids)
    assert engine.max_batch >= 3  # the contract hands all running sequences to one _decode_impl call
    generations = [engine.start(request) for request in requests]
    try:
        engine.prepare_images(generations)
        assert all(engine.prefill_batch(generations))
        while not all(g.done for g in generations):
            engine.step(generations)
    finally:
        for generation in generations:
            engine.finish(generation)
    assert [g.stats.token_ids for g in generations] == expected
