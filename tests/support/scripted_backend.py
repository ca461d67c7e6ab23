"""A small, deterministic backend for the serving layer's fast tests, plugged in through the backend_factory seam.

It implements the real contract (InferenceBackend's _impl methods), so the real scheduler, service and breaker
drive it. Its "model" answers with the alphabet; knobs make it fail, raise an internal ValueError, or hang, the
way a broken engine would. It stands in for a model, not for anything the tests could run for real in seconds.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from medgemma_xray.inference_api.contract import InferenceBackend, Prompt
from medgemma_xray.inference_api.errors import NoFreeSlotError
from medgemma_xray.inference_api.types import BackendInfo, GenerationRequest, Mode, TokenStep

STOP = 0


class ScriptedBackend(InferenceBackend):
    loads: Counter = Counter()  # per mode, across instances: how many times a factory built one
    instances: list = []

    def __init__(self, mode: Mode, answer_length: int = 8, step_delay_s: float = 0.0, slots: int = 64) -> None:
        super().__init__(max_resident_conversations=4)
        self.mode, self.answer_length, self.step_delay_s = mode, answer_length, step_delay_s
        self.stop_token_ids = frozenset({STOP})
        self.max_batch = 64
        self.free_slots = slots
        self.failures = 0  # the next N model calls raise RuntimeError
        self.internal_value_errors = 0  # the next N model calls raise a ValueError (an internal bug, not the user's)
        self.hang = threading.Event()  # while set, model calls block (a hung engine)
        self.released = threading.Event()
        self.decode_batches: list[int] = []
        self.closed_count = 0
        ScriptedBackend.loads[mode] += 1
        ScriptedBackend.instances.append(self)

    def _encode_impl(self, request: GenerationRequest) -> Prompt:
        text = " ".join(turn.text for turn in request.turns)
        return Prompt(ids=[ord(c) % 200 + 1 for c in text], image=None, image_key=None)

    def _allocate_impl(self):
        if self.free_slots <= 0:
            raise NoFreeSlotError("no slot")
        self.free_slots -= 1
        return {"length": 0}

    def _free_impl(self, kv) -> None:
        self.free_slots += 1

    def _model_call(self) -> None:
        while self.hang.is_set() and not self.released.wait(0.01):
            pass
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("scripted engine failure")
        if self.internal_value_errors > 0:
            self.internal_value_errors -= 1
            raise ValueError("operands could not be broadcast together with shapes (1,4) (1,5)")

    def _next(self, kv) -> TokenStep:
        kv["length"] += 1
        generated = kv["length"] - kv["prompt"]
        token = STOP if generated > self.answer_length else 97 + (generated - 1) % 26
        return TokenStep(token, -0.1 * generated)

    def _prefill_impl(self, kv, prompt, start, end, want_token):
        self._model_call()
        kv["prompt"] = end
        kv["length"] = end
        return self._next(kv) if want_token else None

    def _prompt_logits_impl(self, kv, prompt):
        # A scripted backend has tokens, not a distribution: next_token_logits is tested on the real backends.
        raise NotImplementedError("the scripted test backend has no logits")

    def _decode_impl(self, kvs, tokens, positions):
        self._model_call()
        self.decode_batches.append(len(kvs))
        return [self._next(kv) for kv in kvs]

    def _detokenize_impl(self, ids):
        return "".join(chr(i) if i >= 32 else "" for i in ids)

    def _image_features_impl(self, images):
        return [[0.0]] * len(images)

    def _info_impl(self) -> BackendInfo:
        return BackendInfo(self.mode, "fp32", "cpu", "scripted", "scripted-test-model", False)

    def _warm_up_impl(self) -> None:
        return None

    def _close_impl(self) -> None:
        self.closed_count += 1


def scripted_factory(**options):
    """A backend_factory for InferenceService: a new ScriptedBackend for each load."""

    def factory(mode, settings):
        return ScriptedBackend(Mode.parse(mode), **options)

    return factory
