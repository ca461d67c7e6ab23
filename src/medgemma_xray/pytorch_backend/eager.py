"""PyTorch reference backend: transformers' Gemma3ForConditionalGeneration, run as the model card runs it.

Each prefill and decode step is one call of the model's own forward with a DynamicCache per conversation, so its
greedy tokens are those of `model.generate` (a test checks it). Every other backend is compared with this one.
bf16 on CUDA, fp32 on CPU. Never fp16: Gemma 3's activations overflow it (transformers#36822).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from medgemma_xray.engine_bundle.checkpoint_profile import checkpoint_profile
from medgemma_xray.engine_bundle.defaults import DEFAULT_MAX_RESIDENT_CONVERSATIONS
from medgemma_xray.inference_api.chat import chat_messages
from medgemma_xray.inference_api.contract import (
    BackendInfo,
    GenerationRequest,
    InferenceBackend,
    Mode,
    Prompt,
    TokenStep,
)
from medgemma_xray.pytorch_backend.checkpoint import CheckpointDescription, describe_checkpoint

logger = logging.getLogger(__name__)


class TorchInference(InferenceBackend):
    mode = Mode.PYTORCH
    executor_name = "transformers"

    def __init__(
        self,
        model_path: str | Path,
        device: str = "auto",
        max_resident_conversations: int = DEFAULT_MAX_RESIDENT_CONVERSATIONS,
        preloaded: tuple | None = None,
        checkpoint: str = "auto",
    ) -> None:
        """preloaded: (model, processor) already in memory, e.g. the benchmark's full-size random-weight model;
        model_path then only names it. checkpoint: MODEL_CHECKPOINT (which checkpoint this is, where its files do
        not say: engine_bundle/checkpoint_profile)."""
        super().__init__(max_resident_conversations)
        import torch

        self._torch = torch
        self.model_path = Path(model_path)
        started = time.perf_counter()
        if preloaded is None:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            self.checkpoint = describe_checkpoint(self.model_path, checkpoint)
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self.device = torch.device(device)
            self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
            self.processor = AutoProcessor.from_pretrained(self.model_path)
            self.model = AutoModelForImageTextToText.from_pretrained(self.model_path, dtype=self.dtype)
            # transformers wraps PreTrainedModel.to so that its stub reads the device as `self`
            self.model.to(self.device).eval()
        else:
            self.model, self.processor = preloaded
            parameter = next(self.model.parameters())
            self.device, self.dtype = parameter.device, parameter.dtype
            profile = checkpoint_profile(self.model_path, checkpoint)  # the benchmark names what it stands for
            self.checkpoint = CheckpointDescription(self.model_path, str(self.model_path), False, None, profile)
        self.load_s = time.perf_counter() - started
        config = self.model.config
        eos = self.model.generation_config.eos_token_id
        self.stop_token_ids = frozenset(eos if isinstance(eos, list) else [eos])
        self.image_token_id = int(config.image_token_id)
        self.image_tokens_per_film = int(config.mm_tokens_per_image)
        self.text_config = config.get_text_config()
        logger.info(
            "loaded %s on %s (%s) in %.1f s%s",
            self.checkpoint.model_id,
            self.device,
            self.precision,
            self.load_s,
            f" -- {self.checkpoint.demo_notice}" if self.checkpoint.is_demo else "",
        )

    @property
    def precision(self) -> str:
        return "bf16" if self.dtype == self._torch.bfloat16 else "fp32"

    # --- prompt ------------------------------------------------------------------------------------------------
    def _encode_impl(self, request: GenerationRequest) -> Prompt:
        processor = self.processor
        text = processor.apply_chat_template(
            chat_messages(request, image_placeholder="<image>"), add_generation_prompt=True, tokenize=False
        )
        text = text.replace(processor.boi_token, processor.full_image_sequence)
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Prompt(
            ids=list(ids),
            image=request.image,
            image_key=request.image_key,
            prior=request.prior_image,
            prior_key=request.prior_image_key,
        )

    def pixel_values(self, images: list):
        pixels = self.processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
        return pixels.to(self.device, self.dtype)

    # --- KV state ------------------------------------------------------------------------------------------------
    def _allocate_impl(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.text_config)

    def _truncate_impl(self, kv, length: int) -> bool:
        if kv.get_seq_length() >= self.text_config.sliding_window - 1:
            return False  # the sliding layers no longer hold the tokens a crop would need
        kv.crop(length - kv.get_seq_length())
        return True

    def _free_impl(self, kv) -> None:
        del kv

    # --- model calls -----------------------------------------------------------------------------------------
    def _prefill_impl(self, kv, prompt: Prompt, start: int, end: int, want_token: bool) -> TokenStep | None:
        logits = self._forward_prompt(kv, prompt, start, end)
        return _greedy(self._torch, logits)[0] if want_token else None

    def _prompt_logits_impl(self, kv, prompt: Prompt):
        return self._forward_prompt(kv, prompt, 0, len(prompt.ids))[0].float().cpu().numpy()

    def _chunk_logits_impl(self, kv, prompt: Prompt, start: int, end: int):
        return self._forward_prompt(kv, prompt, start, end)[0].float().cpu().numpy()

    def _forward_prompt(self, kv, prompt: Prompt, start: int, end: int):
        torch = self._torch
        ids = torch.tensor([prompt.ids[start:end]], device=self.device)
        inputs = {"input_ids": ids, "position_ids": torch.arange(start, end, device=self.device)[None]}
        is_image = ids == self.image_token_id
        if bool(is_image.any()):
            if start > 0 and prompt.ids[start - 1] == self.image_token_id:
                raise RuntimeError("prefill chunk starts inside an image")  # the contract never cuts there
            # The films whose image tokens this chunk holds (a prior's come first): the processor's pixels of
            # exactly those, in order, as transformers places one film's features per run of image tokens.
            before = _image_runs(prompt.ids[:start], self.image_token_id)
            inside = _image_runs(prompt.ids[start:end], self.image_token_id)
            inputs["pixel_values"] = self.pixel_values(prompt.images[before : before + inside])
            inputs["token_type_ids"] = is_image.long()
        with torch.inference_mode():
            output = self.model(**inputs, past_key_values=kv, use_cache=True, logits_to_keep=1)
        return output.logits[:, -1]

    def _decode_impl(self, kvs: list, tokens: list[int], positions: list[int]) -> list[TokenStep]:
        torch = self._torch
        steps = []
        with torch.inference_mode():
            for kv, token, position in zip(kvs, tokens, positions, strict=True):
                output = self.model(
                    input_ids=torch.tensor([[token]], device=self.device),
                    position_ids=torch.tensor([[position]], device=self.device),
                    past_key_values=kv,
                    use_cache=True,
                    logits_to_keep=1,
                )
                steps.append(_greedy(torch, output.logits[:, -1])[0])
        return steps

    def _detokenize_impl(self, ids: list[int]) -> str:
        return self.processor.tokenizer.decode(ids, skip_special_tokens=True)

    # --- the rest of the contract ------------------------------------------------------------------------------
    def _image_features_impl(self, images: list):
        with self._torch.inference_mode():
            # torch types an nn.Module attribute as Tensor | Module, and a Tensor is not callable
            features = self.model.get_image_features(pixel_values=self.pixel_values(images))
        features = getattr(features, "pooler_output", features)
        return features.float().cpu().numpy()

    def _info_impl(self) -> BackendInfo:
        device = self._torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return BackendInfo(
            mode=Mode.PYTORCH,
            precision=self.precision,
            device=device,
            executor=self.executor_name,
            model_id=self.checkpoint.model_id,
            is_demo=self.checkpoint.is_demo,
            demo_notice=self.checkpoint.demo_notice,
            capabilities=self.checkpoint.profile.capabilities,
            checkpoint_kind=self.checkpoint.profile.kind,
            details={
                "model_path": str(self.model_path),
                "load_s": round(self.load_s, 2),
                "checkpoint_recognised_by": self.checkpoint.profile.source,
            },
        )

    def _close_impl(self) -> None:
        del self.model
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()


def _image_runs(ids: list[int], image_token_id: int | None) -> int:
    """How many runs of image tokens (films) `ids` holds."""
    runs, previous = 0, False
    for token in ids:
        current = token == image_token_id
        runs += current and not previous
        previous = current
    return runs


def _greedy(torch, logits) -> list[TokenStep]:
    """Argmax and its log-probability for each row of (batch, vocab) logits, computed in fp32 on the device."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    best = logprobs.max(dim=-1)
    return [TokenStep(int(t), float(p)) for t, p in zip(best.indices.tolist(), best.values.tolist(), strict=True)]
