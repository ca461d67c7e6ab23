"""TRTInference: serves an engine bundle from optimize_trt_engine.py through the same contract as PyTorch.

Never imports torch: numpy, tokenizers + jinja2, PIL, and either TensorRT (engines on an NVIDIA GPU) or
ONNX Runtime (the bundle's own ONNX graphs, Q/DQ included, on CPU: what CI and CPU hosts run).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engine_bundle.integrity import verify_bundle
from engine_bundle.manifest import ManifestError, check_gpu, check_tensorrt_version, read_manifest
from engine_bundle.masks import attention_masks, image_block_ids
from inference_api.contract import (
    BackendInfo,
    ChatTurn,
    GenerationRequest,
    GenerationStats,
    IncrementalDecoder,
    InferenceBackend,
    chat_messages,
)

logger = logging.getLogger(__name__)

EXECUTORS = ("auto", "tensorrt", "onnxruntime-cpu")


def _tensorrt_module(manifest: dict) -> str:
    return "tensorrt_rtx" if manifest["tensorrt"].get("target") == "tensorrt-rtx" else "tensorrt"


class TRTInference(InferenceBackend):
    mode = "tensorrt"

    def __init__(
        self,
        bundle_dir: str | Path,
        executor: str = "auto",
        sequence_slots: int = 2,
        require_verified: bool = True,
    ) -> None:
        """Open a bundle. It must have passed its accuracy gate and match its recorded file hashes; only the build
        itself (which verifies the bundle it is making) opens one with require_verified=False."""
        super().__init__()
        if executor not in EXECUTORS:
            raise ValueError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
        self.bundle_dir = Path(bundle_dir)
        self.manifest = manifest = read_manifest(self.bundle_dir)
        started = time.perf_counter()
        if require_verified:
            verify_bundle(self.bundle_dir, manifest)
        else:
            logger.info("opening %s without its accuracy gate and file hashes (the build verifying it)", bundle_dir)
        self.executor = self._open_executor(executor, sequence_slots)
        shapes = manifest["shapes"]
        self.image_tokens, self.sliding_window = shapes["image_tokens"], shapes["sliding_window"]
        self.max_sequence = shapes["max_sequence"]
        from trt_inference.runtime.image import ImagePreprocessor
        from trt_inference.runtime.text import BundleText

        self.text = BundleText(self.bundle_dir, self.image_tokens)
        processor_config = json.loads((self.bundle_dir / "processor_config.json").read_text())
        self.preprocess = ImagePreprocessor(processor_config.get("image_processor", processor_config))
        self.stop_ids = set(manifest["tokens"]["eos"])
        logger.info(
            "loaded engine bundle %s (%s, %s) with %s in %.1f s%s",
            self.bundle_dir, manifest["model"]["id"], manifest["precision"], self.executor.name,
            time.perf_counter() - started,
            " -- DEMO MODEL WITH RANDOM WEIGHTS: answers mean nothing" if manifest["model"].get("is_demo") else "",
        )  # fmt: skip

    def _open_executor(self, choice: str, sequence_slots: int):
        manifest = self.manifest
        has_engines = all(entry.get("engine") for entry in manifest["graphs"].values())
        module = _tensorrt_module(manifest)
        if choice == "auto":
            why_not = _why_not_tensorrt(has_engines, module)
            choice = "onnxruntime-cpu" if why_not else "tensorrt"
            if why_not:
                logger.info("executor auto: chose onnxruntime-cpu because %s", why_not)
        if choice == "onnxruntime-cpu":
            from trt_inference.runtime.onnx_executor import OnnxRuntimeExecutor

            return OnnxRuntimeExecutor(self.bundle_dir, manifest, sequence_slots)
        if not has_engines:
            raise ManifestError(
                f"{self.bundle_dir} holds ONNX graphs only (built where TensorRT was absent). Finish the build on the "
                f"GPU host: python optimize_trt_engine.py --from_onnx {self.bundle_dir} --target tensorrt"
            )
        if importlib.util.find_spec(module) is None:
            raise ManifestError(f"the bundle needs the {module} Python package, which is not installed")
        trt = importlib.import_module(module)
        check_tensorrt_version(manifest, trt.__version__)  # before touching the GPU or the plans
        from trt_inference.runtime.cuda_memory import probe_cuda_gpu

        gpu, why_no_gpu = probe_cuda_gpu(0)
        if gpu is None:
            raise ManifestError(f"the TensorRT executor needs an NVIDIA GPU and cuda-python: {why_no_gpu}")
        check_gpu(manifest, *gpu)
        from trt_inference.runtime.tensorrt_executor import TensorRTExecutor

        return TensorRTExecutor(self.bundle_dir, manifest, sequence_slots)

    # --- generation ------------------------------------------------------------------------------------------
    def prompt_ids(self, request: GenerationRequest) -> np.ndarray:
        return self.text.encode_chat(chat_messages(request, image_placeholder="<image>"))

    def _stream_generate_impl(self, request: GenerationRequest, stats: GenerationStats) -> Iterator[str]:
        started = time.perf_counter()
        decoder = IncrementalDecoder(self.text.decode)
        for token, _logits in self.generate_tokens(request, stats):
            if stats.first_token_s is None:
                stats.first_token_s = time.perf_counter() - started
            delta = decoder.push(token)
            if delta:
                yield delta
        tail = decoder.flush()
        if tail:
            yield tail

    def generate_tokens(self, request: GenerationRequest, stats: GenerationStats | None = None):
        """Greedy decoding: yield (token id, float32 logits it was chosen from) until a stop token or the limit."""
        stats = stats if stats is not None else GenerationStats()
        ids = self.prompt_ids(request)
        length = ids.shape[1]
        stats.prompt_tokens = length
        if length + request.max_new_tokens > self.max_sequence:
            raise ValueError(
                f"the conversation ({length} tokens) plus the answer ({request.max_new_tokens}) exceeds the engine's "
                f"maximum of {self.max_sequence} tokens; start a new case or rebuild with a larger --max_seq_len"
            )
        embeds = self._prompt_embeddings(ids, request.image)
        blocks = image_block_ids((ids == self.text.image_token_id).astype(np.int64))
        positions = np.arange(length, dtype=np.int64)[None]
        key_positions = np.concatenate([[-1], positions[0]])[None]
        key_blocks = np.concatenate([[-1], blocks[0]])[None]
        full, sliding = attention_masks(positions, key_positions, self.sliding_window, blocks, key_blocks)
        sequence = self.executor.new_sequence()
        try:
            logits = sequence.run(embeds, positions, full, sliding)
            for step in range(request.max_new_tokens):
                token = int(np.argmax(logits[0]))
                if token in self.stop_ids:
                    return
                stats.new_tokens += 1
                yield token, logits[0]
                if step + 1 == request.max_new_tokens:
                    return
                position = length + step
                key_positions = np.concatenate([key_positions, [[position]]], axis=1)
                query = np.asarray([[position]], dtype=np.int64)
                full, sliding = attention_masks(query, key_positions, self.sliding_window)
                logits = sequence.run(self.executor.embed(np.asarray([[token]])), query, full, sliding)
        finally:
            sequence.close()

    def _prompt_embeddings(self, ids: np.ndarray, image) -> np.ndarray:
        embeds = self.executor.embed(ids)
        image_rows = np.flatnonzero(ids[0] == self.text.image_token_id)
        if image_rows.size:
            features = self.executor.vision(self.preprocess([image]))
            embeds[0, image_rows] = features.reshape(-1, features.shape[-1])[: image_rows.size]
        return embeds

    # --- the rest of the contract --------------------------------------------------------------------------
    def _image_features_impl(self, images: list) -> np.ndarray:
        return self.executor.vision(self.preprocess(images)).astype(np.float32)

    def _info_impl(self) -> BackendInfo:
        manifest = self.manifest
        device = "cpu"
        if self.executor.name == "tensorrt":
            from trt_inference.runtime.cuda_memory import device_compute_capability

            device = device_compute_capability(0)[0]
        return BackendInfo(
            mode="tensorrt",
            precision=manifest["precision"],
            device=device,
            executor=self.executor.name,
            model_id=manifest["model"]["id"],
            is_demo=bool(manifest["model"].get("is_demo")),
            details={
                "bundle": str(self.bundle_dir),
                "tensorrt": manifest["tensorrt"],
                "accuracy": manifest.get("accuracy"),
                "accuracy_measured_on": (manifest.get("accuracy") or {}).get("measured_on"),
            },
        )

    def _warm_up_impl(self) -> None:
        from PIL import Image

        request = GenerationRequest(Image.new("RGB", (64, 64)), (ChatTurn("user", "Warm-up."),), max_new_tokens=2)
        for _ in self._stream_generate_impl(request, GenerationStats()):
            pass

    def _close_impl(self) -> None:
        self.executor.close()


def _has_cuda_gpu() -> bool:
    from trt_inference.runtime.cuda_memory import probe_cuda_gpu

    return probe_cuda_gpu(0)[0] is not None


def _why_not_tensorrt(has_engines: bool, module: str) -> str:
    """Why `auto` cannot use the TensorRT executor here ('' when it can): the log line says which."""
    if not has_engines:
        return "the bundle holds no TensorRT plans (built with --target none)"
    if importlib.util.find_spec(module) is None:
        return f"the {module} package is not installed"
    from trt_inference.runtime.cuda_memory import probe_cuda_gpu

    return probe_cuda_gpu(0)[1]
