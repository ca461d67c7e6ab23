"""TRTInference: serves an engine bundle from optimize_trt_engine.py through the same contract as PyTorch.

Never imports torch: numpy, tokenizers + jinja2, PIL, and either TensorRT (engines on an NVIDIA GPU) or
ONNX Runtime (the bundle's own ONNX graphs, Q/DQ included, on CPU: what CI and CPU hosts run).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from pathlib import Path

import numpy as np

from medgemma_xray.engine_bundle.checkpoint_profile import CheckpointProfile, checkpoint_profile
from medgemma_xray.engine_bundle.defaults import DEFAULT_MAX_RESIDENT_CONVERSATIONS, DEFAULT_SEQUENCE_SLOTS, DEMO_NOTICE
from medgemma_xray.engine_bundle.gate import UNVERIFIED_NOTICE, unverified_reason
from medgemma_xray.engine_bundle.identity import check_model_identity
from medgemma_xray.engine_bundle.integrity import BundleRefusedError, refuse_links, verify_bundle
from medgemma_xray.engine_bundle.manifest import (
    ManifestError,
    check_gpu,
    check_tensorrt_version,
    read_manifest,
    rebuild_command,
)
from medgemma_xray.engine_bundle.masks import attention_masks, image_block_ids
from medgemma_xray.engine_bundle.names import runtime_module
from medgemma_xray.inference_api.chat import chat_messages
from medgemma_xray.inference_api.contract import (
    BackendInfo,
    GenerationRequest,
    InferenceBackend,
    Mode,
    Prompt,
    TokenStep,
)
from medgemma_xray.trt_inference.runtime.executor_protocol import BatchDecoder, Executor, ExecutorSequence

logger = logging.getLogger(__name__)

EXECUTORS = ("auto", "tensorrt", "onnxruntime-cpu")


class UnverifiedExecutorError(BundleRefusedError):
    """The executor that would run this bundle is not the one its accuracy was measured on (no override given)."""


class TRTInference(InferenceBackend):
    mode = Mode.TRT

    def __init__(
        self,
        engine_path: str | Path,
        input_shape: tuple[int, ...] | None = None,
        executor: str = "auto",
        sequence_slots: int = DEFAULT_SEQUENCE_SLOTS,
        max_resident_conversations: int = DEFAULT_MAX_RESIDENT_CONVERSATIONS,
        require_verified: bool = True,
        served_model: str | Path | None = None,
        allow_unverified_plans: bool = False,
        checkpoint: str = "auto",
    ) -> None:
        """engine_path: the bundle folder, or any file inside it (a .plan or .onnx). input_shape: the vision input
        the caller will send, checked against the bundle's (batch up to its max_batch, 3 channels, its image size).
        The bundle must have passed its accuracy gate (its recorded figures against its recorded thresholds) and
        match its recorded file hashes; only the build itself (which verifies the bundle it is making) opens one
        with require_verified=False. served_model: the PyTorch checkpoint served beside it (the breaker's
        fallback): a bundle of other weights is refused (ModelMismatchError). The executor that will run must be
        the one the accuracy was measured on, unless allow_unverified_plans (ALLOW_UNVERIFIED_PLANS=1): then
        info() says "accuracy not verified on this executor" everywhere it is shown. checkpoint: MODEL_CHECKPOINT;
        otherwise the profile the build recorded of its source model (or, for a bundle built before it did, the
        served model's: the identity check made sure it is the same checkpoint)."""
        super().__init__(max_resident_conversations)
        if executor not in EXECUTORS:
            raise ValueError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
        self.bundle_dir = _bundle_folder(Path(engine_path))
        if require_verified:
            refuse_links(self.bundle_dir)  # before the manifest is read: it may be the link
        self.manifest = manifest = read_manifest(self.bundle_dir)
        if input_shape is not None:
            _check_input_shape(tuple(input_shape), manifest["shapes"], self.bundle_dir)
        started = time.perf_counter()
        if require_verified:
            verify_bundle(self.bundle_dir, manifest)
        else:
            logger.info(
                "opening %s without its accuracy gate and file hashes (the build verifying it)", self.bundle_dir
            )
        if served_model is not None:
            check_model_identity(self.bundle_dir, manifest, served_model)
        choice, self.executor_note = self._choose_executor(executor)
        self.unverified_reason = ""
        if choice == "tensorrt":  # what makes it unable to run at all is said before whether it was verified
            self._check_tensorrt_can_run()
        if require_verified:
            self.unverified_reason = self._check_executor_verified(choice, allow_unverified_plans)
        self.executor = self._open_executor(choice, sequence_slots)
        if isinstance(self.executor, BatchDecoder):
            self.max_batch = max(1, sequence_slots)  # the contract's step() hands every running sequence at once
        shapes = manifest["shapes"]
        self.image_tokens, self.sliding_window = shapes["image_tokens"], shapes["sliding_window"]
        self.max_sequence = shapes["max_sequence"]
        from medgemma_xray.trt_inference.runtime.image import ImagePreprocessor
        from medgemma_xray.trt_inference.runtime.text import BundleText

        self.text = BundleText(self.bundle_dir, self.image_tokens)
        processor_config = json.loads((self.bundle_dir / "processor_config.json").read_text())
        self.preprocess = ImagePreprocessor(processor_config.get("image_processor", processor_config))
        self.stop_token_ids = frozenset(manifest["tokens"]["eos"])
        self.image_token_id = self.text.image_token_id
        self.image_tokens_per_film = self.image_tokens  # the contract refuses image markers typed into a question
        self.profile = _bundle_profile(manifest, served_model, checkpoint)
        logger.info(
            "loaded engine bundle %s (%s, %s) with executor %s%s in %.1f s%s%s",
            self.bundle_dir,
            manifest["model"]["id"],
            manifest["precision"],
            self.executor.name,
            f": {self.executor_note}" if self.executor_note else "",
            time.perf_counter() - started,
            f" -- {UNVERIFIED_NOTICE.upper()} ({self.unverified_reason})" if self.unverified_reason else "",
            f" -- {DEMO_NOTICE}" if manifest["model"].get("is_demo") else "",
        )

    def _choose_executor(self, choice: str) -> tuple[str, str]:
        """The executor that will run, and why it is not TensorRT ('' when it is, or when asked for by name)."""
        if choice != "auto":
            return choice, ("chosen by name; TensorRT executes nothing" if choice == "onnxruntime-cpu" else "")
        has_engines = all(entry.get("engine") for entry in self.manifest["graphs"].values())
        why_not = _why_not_tensorrt(has_engines, runtime_module(self.manifest))
        if why_not:
            logger.info("executor auto: chose onnxruntime-cpu because %s", why_not)
            return "onnxruntime-cpu", why_not
        return "tensorrt", ""

    def _check_executor_verified(self, choice: str, allow_unverified: bool) -> str:
        """'' when the accuracy record covers the executor that will run; else refuse, or with the operator's
        override return why it is not covered (shown as "accuracy not verified on this executor")."""
        why = unverified_reason(self.manifest["accuracy"], choice)
        if not why:
            return ""
        if not allow_unverified:
            raise UnverifiedExecutorError(
                f"{self.bundle_dir} would run on the {choice} executor, and its accuracy against PyTorch was never "
                f"measured there: {why}. Rebuild it where that executor runs, so the build's gate runs it "
                f"({rebuild_command(self.manifest)}), or serve it anyway, marked '{UNVERIFIED_NOTICE}' on every "
                "status line and the UI, with ALLOW_UNVERIFIED_PLANS=1."
            )
        logger.warning(
            "serving %s on %s with ALLOW_UNVERIFIED_PLANS=1: %s (%s)", self.bundle_dir, choice, UNVERIFIED_NOTICE, why
        )
        return why

    def _check_tensorrt_can_run(self) -> None:
        """Plans present, the TensorRT module installed, and the version the plans were built with."""
        manifest = self.manifest
        has_engines = all(entry.get("engine") for entry in manifest["graphs"].values())
        module = runtime_module(manifest)
        if not has_engines:
            raise ManifestError(
                f"{self.bundle_dir} holds ONNX graphs only (built where TensorRT was absent). Finish the build on the "
                f"GPU host: python optimize_trt_engine.py --from_onnx {self.bundle_dir} --target tensorrt"
            )
        if importlib.util.find_spec(module) is None:
            raise ManifestError(f"the bundle needs the {module} Python package, which is not installed")
        trt = importlib.import_module(module)
        check_tensorrt_version(manifest, trt.__version__)  # before touching the GPU or the plans

    def _open_executor(self, choice: str, sequence_slots: int) -> Executor:
        manifest = self.manifest
        if choice == "onnxruntime-cpu":
            from medgemma_xray.trt_inference.runtime.onnx_executor import OnnxRuntimeExecutor

            return OnnxRuntimeExecutor(self.bundle_dir, manifest, sequence_slots)
        self._check_tensorrt_can_run()
        from medgemma_xray.trt_inference.runtime.cuda_memory import probe_cuda_gpu

        gpu, why_no_gpu = probe_cuda_gpu(0)
        if gpu is None:
            raise ManifestError(f"the TensorRT executor needs an NVIDIA GPU and cuda-python: {why_no_gpu}")
        check_gpu(manifest, *gpu)
        from medgemma_xray.trt_inference.runtime.tensorrt_executor import TensorRTExecutor

        return TensorRTExecutor(self.bundle_dir, manifest, sequence_slots)

    # --- prompt -------------------------------------------------------------------------------------------
    def prompt_ids(self, request: GenerationRequest) -> np.ndarray:
        return self.text.encode_chat(chat_messages(request, image_placeholder="<image>"))

    def _encode_impl(self, request: GenerationRequest) -> Prompt:
        return Prompt(
            ids=self.prompt_ids(request)[0].tolist(),
            image=request.image,
            image_key=request.image_key,
            prior=request.prior_image,
            prior_key=request.prior_image_key,
        )

    def _detokenize_impl(self, ids: list[int]) -> str:
        return self.text.decode(ids)

    # --- KV state: one executor sequence per conversation ------------------------------------------------------
    def _allocate_impl(self) -> ExecutorSequence:
        return self.executor.new_sequence(timeout_s=0)  # the contract evicts an idle conversation, then retries

    def _truncate_impl(self, sequence: ExecutorSequence, length: int) -> bool:
        sequence.truncate(length)  # both executors' sequences truncate (executor_protocol)
        return True

    def _free_impl(self, sequence: ExecutorSequence) -> None:
        sequence.close()

    # --- model calls -------------------------------------------------------------------------------------------
    def _prepare_images_impl(self, prompts: list[Prompt]) -> None:
        features = self.executor.vision(self.preprocess([prompt.image for prompt in prompts]))
        for prompt, row in zip(prompts, features, strict=True):
            prompt.features = row

    def _prefill_impl(
        self, sequence: ExecutorSequence, prompt: Prompt, start: int, end: int, want_token: bool
    ) -> TokenStep | None:
        logits = self._run_prompt(sequence, prompt, start, end)
        return _greedy(logits[0]) if want_token else None

    def _prompt_logits_impl(self, sequence: ExecutorSequence, prompt: Prompt) -> np.ndarray:
        return self._run_prompt(sequence, prompt, 0, len(prompt.ids))[0]

    def _chunk_logits_impl(self, sequence: ExecutorSequence, prompt: Prompt, start: int, end: int) -> np.ndarray:
        return self._run_prompt(sequence, prompt, start, end)[0]

    def _run_prompt(self, sequence: ExecutorSequence, prompt: Prompt, start: int, end: int) -> np.ndarray:
        ids = np.asarray([prompt.ids], dtype=np.int64)
        chunk = ids[:, start:end]
        embeds = self.executor.embed(chunk)
        image_rows = np.flatnonzero(chunk[0] == self.text.image_token_id)
        if image_rows.size:
            # The i-th image token of the prompt takes feature row i: the films' rows in prompt order (a prior's
            # first), the vision graph run once per film (the contract's _prepare_images).
            first = int(np.count_nonzero(ids[0, :start] == self.text.image_token_id))
            features = prompt.features.reshape(-1, prompt.features.shape[-1])
            embeds[0, image_rows] = features[first : first + image_rows.size]
        blocks = image_block_ids((ids == self.text.image_token_id).astype(np.int64))[:, :end]
        positions = np.arange(start, end, dtype=np.int64)[None]
        key_positions = np.concatenate([[-1], np.arange(end)])[None]
        key_blocks = np.concatenate([[-1], blocks[0]])[None]
        full, sliding = attention_masks(positions, key_positions, self.sliding_window, blocks[:, start:], key_blocks)
        return sequence.run(embeds, positions, full, sliding)

    def _decode_impl(
        self, sequences: list[ExecutorSequence], tokens: list[int], positions: list[int]
    ) -> list[TokenStep]:
        if isinstance(self.executor, BatchDecoder) and len(sequences) > 1:
            # Every running sequence in one executor call: one read of the weights for all of them.
            embeds = self.executor.embed(np.asarray(tokens, dtype=np.int64)[:, None])
            logits = self.executor.decode_batch(sequences, embeds, self.sliding_window)
            return [_greedy(row) for row in logits]
        # One at a time: a lone sequence, or an executor without a batch path (TensorRT: its per-slot device
        # buffers have no batch axis yet).
        steps = []
        for sequence, token, position in zip(sequences, tokens, positions, strict=True):
            query = np.asarray([[position]], dtype=np.int64)
            key_positions = np.concatenate([[-1], np.arange(position + 1)])[None]
            full, sliding = attention_masks(query, key_positions, self.sliding_window)
            logits = sequence.run(self.executor.embed(np.asarray([[token]])), query, full, sliding)
            steps.append(_greedy(logits[0]))
        return steps

    # --- the rest of the contract --------------------------------------------------------------------------
    def _image_features_impl(self, images: list) -> np.ndarray:
        return self.executor.vision(self.preprocess(images)).astype(np.float32)

    def _info_impl(self) -> BackendInfo:
        manifest = self.manifest
        device = "cpu"
        if self.executor.name == "tensorrt":
            from medgemma_xray.trt_inference.runtime.cuda_memory import device_compute_capability

            device = device_compute_capability(0)[0]
        return BackendInfo(
            mode=Mode.TRT,
            precision=manifest["precision"],
            device=device,
            executor=self.executor.name,
            model_id=manifest["model"]["id"],
            is_demo=bool(manifest["model"].get("is_demo")),
            demo_notice=manifest["model"].get("demo_notice")
            or (DEMO_NOTICE if manifest["model"].get("is_demo") else None),
            executor_note=self.executor_note,
            unverified_reason=self.unverified_reason,
            capabilities=self.profile.capabilities,
            checkpoint_kind=self.profile.kind,
            details={
                "bundle": str(self.bundle_dir),
                "tensorrt": manifest["tensorrt"],
                "accuracy": manifest.get("accuracy"),
                "accuracy_measured_on": (manifest.get("accuracy") or {}).get("measured_on"),
            },
        )

    def _close_impl(self) -> None:
        self.executor.close()


def _bundle_profile(manifest: dict, served_model: str | Path | None, checkpoint: str) -> CheckpointProfile:
    """Which checkpoint the bundle was built from, and what it can do (engine_bundle/checkpoint_profile)."""
    recorded = manifest["model"].get("profile")
    if checkpoint == "auto" and isinstance(recorded, dict):
        return CheckpointProfile.from_manifest(recorded)
    if served_model is not None:
        return checkpoint_profile(served_model, checkpoint)
    return CheckpointProfile("", "unrecorded (a bundle built before checkpoint profiles)", frozenset(), "")


def _bundle_folder(path: Path) -> Path:
    """The bundle that holds `path`: the folder itself, or the nearest parent with a manifest (for a .plan file)."""
    from medgemma_xray.engine_bundle.manifest import MANIFEST_NAME

    for candidate in (path, *path.parents):
        if (candidate / MANIFEST_NAME).is_file():
            return candidate
    return path  # read_manifest explains what is missing


def _check_input_shape(shape: tuple[int, ...], shapes: dict, bundle_dir: Path) -> None:
    size = shapes["image_size"]
    expected = f"(1..{shapes['max_batch']}, 3, {size}, {size})"
    if len(shape) != 4 or shape[1:] != (3, size, size) or not 1 <= shape[0] <= shapes["max_batch"]:
        raise ManifestError(
            f"input_shape {shape} does not match the engine bundle {bundle_dir}: it takes pixel values of shape "
            f"{expected}. Pass that shape, or rebuild with optimize_trt_engine.py --max_batch N for larger batches."
        )


def _greedy(logits: np.ndarray) -> TokenStep:
    """Argmax of float32 logits and its log-probability (log-softmax in float64 for a stable confidence)."""
    token = int(np.argmax(logits))
    shifted = logits.astype(np.float64) - float(logits[token])
    return TokenStep(token, float(-np.log(np.exp(shifted).sum())))


def _why_not_tensorrt(has_engines: bool, module: str) -> str:
    """Why `auto` cannot use the TensorRT executor here ('' when it can): every status line shows it."""
    if not has_engines:
        return "no TensorRT plans in this bundle"
    if importlib.util.find_spec(module) is None:
        return f"the TensorRT plans cannot run here: the {module} package is not installed"
    from medgemma_xray.trt_inference.runtime.cuda_memory import probe_cuda_gpu

    why = probe_cuda_gpu(0)[1]
    return f"the TensorRT plans cannot run here: {why}" if why else ""
