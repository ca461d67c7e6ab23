"""The fast PyTorch path: a static slotted KV cache, batched decode steps captured as CUDA graphs, argmax and
log-probabilities on the device, several prompts prefilled together in one packed, compiled forward, the vision
tower compiled, and a pool of prefix KV blocks that new conversations on the same film copy from.

Same model, weights and prompts as the eager reference (it subclasses it); only the KV state and the decoder loop
differ. On CPU it runs the same code without compile or graphs, which is how CI checks it token for token against
the eager path. bf16 on CUDA, never fp16.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from medgemma_xray.engine_bundle.defaults import DEFAULT_MAX_RESIDENT_CONVERSATIONS
from medgemma_xray.inference_api.contract import DEFAULT_IMAGE_CACHE_GIB, Prompt, TokenStep
from medgemma_xray.inference_api.errors import NoFreeSlotError
from medgemma_xray.inference_api.shared_caches import ImageFeatureCache, PrefixBlockCache
from medgemma_xray.pytorch_backend.eager import TorchInference
from medgemma_xray.pytorch_backend.pixel_cache import DEFAULT_PIXEL_CACHE_FILMS, PixelCache
from medgemma_xray.pytorch_backend.prefill_graphs import DEFAULT_PREFILL_BUCKETS, image_rows

if TYPE_CHECKING:
    from medgemma_xray.pytorch_backend.cuda_graphs import DecodeGraphs
    from medgemma_xray.pytorch_backend.pipelined_decode import PipelinedDecode
    from medgemma_xray.pytorch_backend.prefill_graphs import PrefillGraphs

logger = logging.getLogger(__name__)

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_PREFIX_CACHE_GIB = 1.0  # about 470 blocks of 16 tokens at MedGemma-4B's size: 7,500 prompt tokens
PREFIX_BLOCK_TOKENS = 16  # vLLM's default block size


class SlotState:
    """One conversation's slot of the static cache."""

    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot


class FastTorchInference(TorchInference):
    executor_name = "transformers-fast"
    resumes_inside_images = True  # image rows are placed from prompt.features by position, any chunk start

    def __init__(
        self,
        model_path: str | Path,
        device: str = "auto",
        max_resident_conversations: int = DEFAULT_MAX_RESIDENT_CONVERSATIONS,
        slots: int = 16,
        max_sequence: int = 4096,
        compile: bool | None = None,
        cuda_graphs: bool | None = None,
        batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS,
        prefill_chunk_tokens: int = 1024,
        preloaded: tuple | None = None,
        prefix_cache_gib: float = DEFAULT_PREFIX_CACHE_GIB,
        image_cache_gib: float = DEFAULT_IMAGE_CACHE_GIB,
        weights: str = "bf16",
        fused_step: bool = False,
        prefill_buckets: tuple[int, ...] | None = None,
        pipelined: bool | None = None,
        vision_graph: bool | None = None,
        pixel_cache_films: int = DEFAULT_PIXEL_CACHE_FILMS,
    ) -> None:
        """Issue 21's first-token and overlap options (None: on where CUDA graphs are, off elsewhere):
        prefill_buckets: prompt sizes a new conversation's prefill is padded to and, with CUDA graphs, replayed as
        one captured graph (pytorch_backend/prefill_graphs; () turns it off); pipelined: the next decode step
        queued before the host reads this one (pytorch_backend/pipelined_decode); vision_graph: the compiled
        vision tower captured as a CUDA graph for one film; pixel_cache_films: preprocessed films kept by content
        hash (preprocess_film)."""
        self.weights = weights
        super().__init__(model_path, device, max_resident_conversations, preloaded)
        from medgemma_xray.pytorch_backend.static_decoder import StaticGemmaDecoder

        on_cuda = self.device.type == "cuda"
        self.use_compile = on_cuda if compile is None else compile
        self.use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        self.max_sequence = max_sequence
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.decoder = StaticGemmaDecoder(self.model, slots=slots, max_len=max_sequence)
        self._free_slots = list(range(slots - 1, -1, -1))
        self.max_batch = max(b for b in batch_buckets if b <= slots) if slots >= 1 else 1
        self.batch_buckets = tuple(b for b in batch_buckets if b <= self.max_batch)
        self._step = self.decoder.decode
        self.fused = None  # issue 21: the fused-KV-write step, and the 8-bit weight mode (pytorch_backend/fused_step)
        if fused_step or weights != "bf16":
            from medgemma_xray.pytorch_backend.fused_step import FusedDecodeStep

            self.fused = FusedDecodeStep(self.decoder, weights)
        self._graphs: DecodeGraphs | None = None
        self._vision_one = self.model.get_image_features  # compiled in warm-up: one film, its fixed shape
        if prefill_buckets is None:
            prefill_buckets = DEFAULT_PREFILL_BUCKETS if self.use_graphs else ()
        self.prefill_buckets = tuple(prefill_buckets)
        self._prefill_graphs: PrefillGraphs | None = None  # made in warm-up (captured there with CUDA graphs)
        self.use_pipelined = self.use_graphs if pipelined is None else pipelined
        self._pipeline: PipelinedDecode | None = None  # made in warm-up
        self._last_launch: tuple | None = None  # the eager path's last step inputs, for launch_next
        self.use_vision_graph = self.use_graphs if vision_graph is None else vision_graph
        self._vision_graph: tuple | None = None  # (graph, static pixels, static features)
        self.pixel_cache = PixelCache(pixel_cache_films)
        self._warmed = False
        self.image_cache = ImageFeatureCache(int(image_cache_gib * 2**30), self.image_cache._size_of)
        blocks = int(prefix_cache_gib * 2**30) // self.decoder.block_bytes(PREFIX_BLOCK_TOKENS)
        self.decoder.allocate_prefix_pool(blocks, PREFIX_BLOCK_TOKENS)
        self.prefix_cache = PrefixBlockCache(blocks, PREFIX_BLOCK_TOKENS)
        self.startup: dict[str, float | str] = {"load_s": round(self.load_s, 2)}
        logger.info(
            "fast path: %d slots x %d tokens of static KV cache (%.2f GiB), prefix pool %d blocks (%.2f GiB), "
            "compile=%s, CUDA graphs=%s",
            slots,
            max_sequence,
            self.decoder.cache_bytes / 2**30,
            blocks,
            blocks * self.decoder.block_bytes(PREFIX_BLOCK_TOKENS) / 2**30,
            self.use_compile,
            self.use_graphs,
        )

    # --- KV state ---------------------------------------------------------------------------------------------
    def _allocate_impl(self):
        if not self._free_slots:
            raise NoFreeSlotError(f"all {self.decoder.slots} KV slots are in use")
        self._forget_queued_step()
        return SlotState(self._free_slots.pop())

    def _truncate_impl(self, kv: SlotState, length: int) -> bool:
        self._forget_queued_step()
        return True  # positions past `length` are simply overwritten by the next prefill

    def _free_impl(self, kv: SlotState) -> None:
        self._forget_queued_step()
        self._free_slots.append(kv.slot)

    def _kv_usage(self) -> float:
        slots = self.decoder.slots
        return (slots - len(self._free_slots)) / slots if slots else 0.0

    def _load_prefix_impl(self, kv: SlotState, pool_ids: list[int], length: int) -> None:
        self._forget_queued_step()
        with self._torch.inference_mode():
            self.decoder.load_prefix(kv.slot, pool_ids, length)

    def _save_prefix_impl(self, kv: SlotState, blocks: list[tuple[int, int]]) -> None:
        with self._torch.inference_mode():
            self.decoder.save_prefix(kv.slot, blocks)

    # --- model calls -------------------------------------------------------------------------------------------
    def preprocess_film(self, image, key: str | None = None) -> str:
        """Resize and normalise a film for the vision tower now, kept by its content hash, so that the question's
        first token does not wait for it. Any thread; takes no backend lock. Returns the key."""
        from medgemma_xray.inference_api.shared_caches import image_content_hash

        key = key or image_content_hash(image)
        if key not in self.pixel_cache:
            with _nvtx(self, "preprocess"), self._torch.inference_mode():
                self.pixel_cache.put(key, self.pixel_values([image]))
        return key

    def _pixels(self, prompts: list[Prompt]):
        """The films' pixels: from the pixel cache for one film preprocessed earlier, else computed now."""
        if len(prompts) == 1:
            cached = self.pixel_cache.get(prompts[0].image_key)
            if cached is not None:
                return cached
        with _nvtx(self, "preprocess"):
            return self.pixel_values([prompt.image for prompt in prompts])

    def _vision(self, pixels):
        """Features of the films in `pixels`: one film through the compiled (and, with CUDA graphs, captured)
        tower, a batch eagerly, so no shape ever recompiles at serving time."""
        torch = self._torch
        with _nvtx(self, "vision"), torch.inference_mode():
            captured = self._vision_graph
            if captured is not None and pixels.shape == captured[1].shape:
                graph, static_pixels, static_features = captured
                static_pixels.copy_(pixels)
                graph.replay()
                return static_features.clone()  # the image cache keeps it; the next replay overwrites the buffer
            # torch types an nn.Module attribute as Tensor | Module, and a Tensor is not callable
            vision = self._vision_one if pixels.shape[0] == 1 else self.model.get_image_features
            features = vision(pixels)
            return getattr(features, "pooler_output", features)

    def _capture_vision(self) -> None:
        """The compiled one-film tower as a CUDA graph (its launches were a share of its 15 ms, 2026-12-01)."""
        torch = self._torch
        from PIL import Image

        static_pixels = self.pixel_values([Image.new("RGB", (896, 896))]).clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                self._vision_one(static_pixels)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.inference_mode():
            out = self._vision_one(static_pixels)
            features = getattr(out, "pooler_output", out)
        self._vision_graph = (graph, static_pixels, features)

    def _prepare_images_impl(self, prompts: list[Prompt]) -> None:
        features = self._vision(self._pixels(prompts))
        for prompt, row in zip(prompts, features, strict=True):
            # Own memory per film: the image cache keeps rows, and a view would pin the whole batch.
            prompt.features = row if features.shape[0] == 1 else row.clone()

    def _prefill_impl(self, kv: SlotState, prompt: Prompt, start: int, end: int, want_token: bool):
        return self._prefill_batch_impl([(kv, prompt, start, end, want_token)])[0]

    def _prefill_batch_impl(self, items: list) -> list[TokenStep | None]:
        """Every chunk in one packed forward; one host sync for all the first tokens. A new conversation's whole
        prompt alone, when it fits a bucket, through the bucket's captured graph instead."""
        torch = self._torch
        self._forget_queued_step()
        if len(items) == 1 and self._prefill_graphs is not None:
            kv, prompt, start, end, want_token = items[0]
            if start == 0 and want_token and self._prefill_graphs.bucket_for(end) is not None:
                return [self._prefill_bucketed(kv, prompt, end)]
        wanted = [index for index, item in enumerate(items) if item[4]]
        with torch.inference_mode():
            logits = self._run_packed(items, wanted or [0])
            if not wanted:
                return [None] * len(items)
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            best = logprobs.max(dim=-1)
            ids, values = best.indices.tolist(), best.values.tolist()
        steps: list[TokenStep | None] = [None] * len(items)
        for row, index in enumerate(wanted):
            steps[index] = TokenStep(ids[row], values[row])
        return steps

    def _prefill_bucketed(self, kv: SlotState, prompt: Prompt, end: int) -> TokenStep:
        torch = self._torch
        graphs = self._prefill_graphs
        assert graphs is not None  # the caller checked
        with _nvtx(self, "prefill.embed"), torch.inference_mode():
            ids = prompt.ids[:end]
            rows, blocks = image_rows(ids, self.image_token_id)
            host = torch.tensor(ids)
            embeds = self.decoder.embed(host.to(self.device, non_blocking=False))
            if rows:
                features = prompt.features.reshape(-1, prompt.features.shape[-1]).to(self.dtype)
                index = torch.tensor(rows).to(self.device)
                embeds[index] = features[index - rows[0]]
        with _nvtx(self, "prefill.graph"), torch.inference_mode():
            token, logprob = graphs.run(kv.slot, embeds, blocks)
            return TokenStep(int(token.tolist()[0]), float(logprob.tolist()[0]))

    def _prompt_logits_impl(self, kv: SlotState, prompt: Prompt):
        with self._torch.inference_mode():
            return self._run_packed([(kv, prompt, 0, len(prompt.ids), True)], [0])[0].float().cpu().numpy()

    def _run_prompt(self, kv: SlotState, prompt: Prompt, start: int, end: int):
        """Logits (1, vocab) of prompt.ids[end-1] after feeding start..end-1 (the weight gate uses it)."""
        return self._run_packed([(kv, prompt, start, end, True)], [0])

    def _run_packed(self, items: list, logit_segments: list[int]):
        from medgemma_xray.pytorch_backend.static_decoder import PrefillSegment

        torch = self._torch
        segments, chunks = [], []
        for kv, prompt, start, end, _ in items:
            ids = torch.tensor(prompt.ids[:end], device=self.device)
            is_image = ids == self.image_token_id
            embeds = self.decoder.embed(ids[start:end])  # the model's scaled embedding (x sqrt(hidden))
            rows = is_image[start:end].nonzero().flatten()
            if rows.numel():
                first_image = int(is_image.nonzero()[0])
                features = prompt.features.reshape(-1, prompt.features.shape[-1]).to(self.dtype)
                embeds[rows] = features[start + rows - first_image]
            chunks.append(embeds)
            segments.append(PrefillSegment(kv.slot, start, end, _image_blocks(torch, is_image)))
        embeds = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        return self.decoder.prefill_packed(segments, embeds, logit_segments)

    def _decode_impl(self, kvs: list, tokens: list[int], positions: list[int]) -> list[TokenStep]:
        torch = self._torch
        slots = [kv.slot for kv in kvs]
        if self._pipeline is not None:
            with _nvtx(self, "decode"), torch.inference_mode():
                ids, logprobs = self._pipeline.step(tokens, positions, slots, owner=self._graphs or self._step)
            return [TokenStep(t, p) for t, p in zip(ids, logprobs, strict=True)]
        with torch.inference_mode():
            if self._graphs is not None:
                ids, logprobs = self._graphs.run(tokens, positions, slots)
            else:
                as_tensor = lambda values: torch.tensor(values, device=self.device)  # noqa: E731
                ids, logprobs = self._step(as_tensor(tokens), as_tensor(positions), as_tensor(slots))
            ids, logprobs = ids.tolist(), logprobs.tolist()  # the one host sync per step
        return [TokenStep(t, p) for t, p in zip(ids, logprobs, strict=True)]

    def _forget_queued_step(self) -> None:
        if self._pipeline is not None:
            self._pipeline.forget()

    def _launch(self, tokens: list[int], positions: list[int], slots: list[int]):
        if self._graphs is not None:
            return self._graphs.run(tokens, positions, slots)
        as_tensor = lambda values: self._torch.tensor(values, device=self.device)  # noqa: E731
        inputs = (as_tensor(tokens), as_tensor(positions), as_tensor(slots))
        ids, logprobs = self._step(*inputs)
        self._last_launch = (ids, inputs[1], inputs[2])
        return ids, logprobs

    def _launch_next(self, batch: int):
        if self._graphs is not None:
            return self._graphs.run_next(batch)
        ids, positions, slots = self._last_launch  # type: ignore[misc]
        positions = positions + 1
        following = self._step(ids, positions, slots)
        self._last_launch = (following[0], positions, slots)
        return following

    # --- start-up: compile and capture before readiness ----------------------------------------------------------
    def _warm_up_impl(self) -> None:
        if self._warmed:  # a second warm-up (a service loading an already-warm backend): one answer, no recapture
            super()._warm_up_impl()
            return
        torch = self._torch
        if self.fused is not None:  # issue 21: gates an 8-bit mode (refused: WeightModeRefused), compiles the step
            from medgemma_xray.pytorch_backend.weight_gate import start_fused_step

            self._step = start_fused_step(self)
        if self.use_compile:
            # One compiled graph per layer type (and batch 1 vs any batch), reused by all 34 layers: the whole
            # step compiled as one graph took over two minutes per batch shape on an H200 host.
            decoder = self.decoder
            # (the compiled functions replace the bound methods on this instance: that is the point)
            decoder.layer_step = torch.compile(decoder.layer_step, dynamic=True)  # type: ignore[method-assign]
            decoder.sample = torch.compile(decoder.sample, dynamic=True)  # type: ignore[method-assign]
            # Prefill: the token-wise parts of a layer, one graph each for any packed token count (the per-chunk
            # attention between them stays eager), reused by all 34 layers.
            decoder.prefill_qkv = torch.compile(decoder.prefill_qkv, dynamic=True)  # type: ignore[method-assign]
            decoder.prefill_out = torch.compile(decoder.prefill_out, dynamic=True)  # type: ignore[method-assign]
            self._vision_one = torch.compile(self.model.get_image_features)
        started = time.perf_counter()
        super()._warm_up_impl()  # one answer: compiles the vision tower and (without graphs) the step
        self.startup["first_answer_s"] = round(time.perf_counter() - started, 2)
        if self.use_graphs:
            from medgemma_xray.pytorch_backend.cuda_graphs import DecodeGraphs

            started = time.perf_counter()
            self._graphs = DecodeGraphs(self._step, self.batch_buckets, self.decoder.dummy_slot, self.device)
            self.startup["capture_s"] = round(time.perf_counter() - started, 2)
        started = time.perf_counter()
        self._warm_up_first_token()
        self.startup["first_token_capture_s"] = round(time.perf_counter() - started, 2)
        if self.use_pipelined:
            from medgemma_xray.pytorch_backend.pipelined_decode import PipelinedDecode

            self._pipeline = PipelinedDecode(
                self._launch, self._launch_next, self.decoder.max_len, max(self.batch_buckets), self.device
            )
        if self.use_graphs or self.use_pipelined or self._prefill_graphs is not None:
            super()._warm_up_impl()
        self._warmed = True
        logger.info("fast path ready: %s", self.startup)

    def _warm_up_first_token(self) -> None:
        """Capture the prefill buckets and the one-film vision tower. A capture that fails leaves that part on
        its uncaptured path (logged, and in startup), never the backend unready."""
        if self.prefill_buckets:
            from medgemma_xray.pytorch_backend.prefill_graphs import PrefillGraphs

            try:
                self._prefill_graphs = PrefillGraphs(
                    self.decoder, self.prefill_buckets, self.use_graphs, self.decoder.dummy_slot
                )
            except Exception as exc:
                logger.warning(
                    "prefill buckets not captured (%s: %s); the packed prefill serves", type(exc).__name__, exc
                )
                self.startup["prefill_graphs_error"] = f"{type(exc).__name__}: {exc}"[:300]
                self._prefill_graphs = None
        if self.use_vision_graph and self.device.type == "cuda":
            try:
                self._capture_vision()
            except Exception as exc:
                logger.warning("vision tower not captured (%s: %s); the compiled tower serves", type(exc).__name__, exc)
                self.startup["vision_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
                self._vision_graph = None

    @property
    def precision(self) -> str:
        base = super().precision
        weights = getattr(self, "weights", "bf16")
        return base if weights == "bf16" else f"{weights} weights, {base} activations"

    def _info_impl(self):
        info = super()._info_impl()
        info.details.update(
            {
                "slots": self.decoder.slots,
                "max_sequence": self.max_sequence,
                "compile": self.use_compile,
                "cuda_graphs": self.use_graphs,
                "batch_buckets": list(self.batch_buckets),
                "prefix_cache_blocks": self.prefix_cache.capacity_blocks,
                "image_cache_bytes": self.image_cache.capacity_bytes,
                "weights": self.weights,
                "fused_step": self.fused is not None,
                "prefill_buckets": list(self._prefill_graphs.buckets) if self._prefill_graphs else [],
                "prefill_graphs": bool(self._prefill_graphs and self._prefill_graphs.graphs),
                "vision_graph": self._vision_graph is not None,
                "pipelined_decode": self._pipeline is not None,
                "startup": self.startup,
            }
        )
        return info


def _image_blocks(torch, is_image):
    """-1 for text, 0, 1, ... for each run of image tokens (transformers' get_block_sequence_ids_for_mask)."""
    previous = torch.nn.functional.pad(is_image, (1, 0))[:-1]
    starts = is_image & ~previous
    groups = torch.cumsum(starts.long(), dim=0) - 1
    return torch.where(is_image, groups, torch.full_like(groups, -1))


def _nvtx(backend, name: str):
    """An NVTX range on CUDA (what an Nsight Systems trace shows per part), nothing on CPU."""
    if backend.device.type == "cuda":
        return backend._torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()
