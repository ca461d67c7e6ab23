"""PyTorch backend: transformers' Gemma3ForConditionalGeneration, the reference for every other backend.

bf16 on CUDA, fp32 on CPU. Never fp16: Gemma 3's activations overflow it (transformers#36822).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from inference_api.contract import (
    BackendInfo,
    ChatTurn,
    GenerationRequest,
    GenerationStats,
    IncrementalDecoder,
    InferenceBackend,
    chat_messages,
)
from pytorch_backend.checkpoint import describe_checkpoint

logger = logging.getLogger(__name__)

_DONE = object()


class TorchInference(InferenceBackend):
    mode = "pytorch"

    def __init__(self, model_path: str | Path, device: str = "auto") -> None:
        super().__init__()
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.model_path = Path(model_path)
        self.checkpoint = describe_checkpoint(self.model_path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        started = time.perf_counter()
        self.processor = AutoProcessor.from_pretrained(self.model_path)
        self.model = AutoModelForImageTextToText.from_pretrained(self.model_path, dtype=self.dtype)
        self.model.to(self.device).eval()
        self._torch = torch
        logger.info(
            "loaded %s on %s (%s) in %.1f s%s",
            self.checkpoint.model_id, self.device, self.precision, time.perf_counter() - started,
            " -- DEMO MODEL WITH RANDOM WEIGHTS: answers mean nothing" if self.checkpoint.is_demo else "",
        )  # fmt: skip

    @property
    def precision(self) -> str:
        return "bf16" if self.dtype == self._torch.bfloat16 else "fp32"

    def model_inputs(self, request: GenerationRequest):
        """The processor's tensors for a request (input_ids, attention_mask, token_type_ids, pixel_values)."""
        inputs = self.processor.apply_chat_template(
            chat_messages(request),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        return inputs.to(self.device, dtype=self.dtype)

    def _stream_generate_impl(self, request: GenerationRequest, stats: GenerationStats) -> Iterator[str]:
        from transformers import StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        started = time.perf_counter()
        inputs = self.model_inputs(request)
        stats.prompt_tokens = int(inputs["input_ids"].shape[1])
        tokens: queue.Queue = queue.Queue()
        cancelled = threading.Event()

        class _Streamer(BaseStreamer):
            def __init__(self) -> None:
                self.prompt_seen = False

            def put(self, value) -> None:
                if not self.prompt_seen:  # generate() first hands over the prompt
                    self.prompt_seen = True
                    return
                for token_id in value.reshape(-1).tolist():
                    tokens.put(token_id)

            def end(self) -> None:
                tokens.put(_DONE)

        torch = self._torch

        class _StopWhenCancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), cancelled.is_set(), dtype=torch.bool, device=input_ids.device)

        def run() -> None:
            try:
                with self._torch.inference_mode():
                    self.model.generate(
                        **inputs,
                        max_new_tokens=request.max_new_tokens,
                        do_sample=False,
                        streamer=_Streamer(),
                        stopping_criteria=StoppingCriteriaList([_StopWhenCancelled()]),
                    )
            except BaseException as exc:  # handed to the consumer, which re-raises it
                tokens.put(exc)
                tokens.put(_DONE)

        worker = threading.Thread(target=run, name="torch-generate", daemon=True)
        worker.start()
        decoder = IncrementalDecoder(lambda ids: self.processor.tokenizer.decode(ids, skip_special_tokens=True))
        try:
            while True:
                item = tokens.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                if stats.first_token_s is None:
                    stats.first_token_s = time.perf_counter() - started
                stats.new_tokens += 1
                delta = decoder.push(item)
                if delta:
                    yield delta
            tail = decoder.flush()
            if tail:
                yield tail
        finally:
            cancelled.set()
            worker.join(timeout=60)

    def _image_features_impl(self, images: list):
        pixel_values = self.processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
        with self._torch.inference_mode():
            features = self.model.get_image_features(pixel_values=pixel_values.to(self.device, self.dtype))
        features = getattr(features, "pooler_output", features)
        return features.float().cpu().numpy()

    def _info_impl(self) -> BackendInfo:
        device = self._torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return BackendInfo(
            mode="pytorch",
            precision=self.precision,
            device=device,
            executor="transformers",
            model_id=self.checkpoint.model_id,
            is_demo=self.checkpoint.is_demo,
            details={"model_path": str(self.model_path)},
        )

    def _warm_up_impl(self) -> None:
        from PIL import Image

        request = GenerationRequest(
            image=Image.new("RGB", (896, 896)), turns=(ChatTurn("user", "Warm-up."),), max_new_tokens=2
        )
        for _ in self._stream_generate_impl(request, GenerationStats()):
            pass

    def _close_impl(self) -> None:
        del self.model
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()
