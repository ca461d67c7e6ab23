"""The fast PyTorch path: a paged KV cache whose prompt pages conversations on one film share by reference,
batched decode steps captured as CUDA graphs and fed from the device (so the scheduler queues step N+1 before it
reads step N), argmax and log-probabilities on the device, several prompts prefilled together in one packed forward
with one attention kernel per layer, and the vision tower compiled.

Same model, weights and prompts as the eager reference (it subclasses it); only the KV state and the decoder loop
differ. On CPU it runs the same code without compile or graphs, which is how CI checks it token for token against
the eager path. bf16 on CUDA, never fp16.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medgemma_xray.engine_bundle.defaults import DEFAULT_MAX_RESIDENT_CONVERSATIONS
from medgemma_xray.inference_api.contract import DEFAULT_IMAGE_CACHE_GIB, Prompt, TokenStep
from medgemma_xray.inference_api.errors import NoFreeSlotError
from medgemma_xray.inference_api.shared_caches import ImageFeatureCache, PrefixBlockCache
from medgemma_xray.pytorch_backend.decode_attention import PAGE_TOKENS
from medgemma_xray.pytorch_backend.eager import TorchInference
from medgemma_xray.pytorch_backend.kv_pages import PagePool, SequenceKV
from medgemma_xray.pytorch_backend.pixel_cache import DEFAULT_PIXEL_CACHE_FILMS, PixelCache
from medgemma_xray.pytorch_backend.prefill_graphs import DEFAULT_PREFILL_BUCKETS, image_rows
from medgemma_xray.pytorch_backend.readback import Readback

if TYPE_CHECKING:
    from medgemma_xray.pytorch_backend.cuda_graphs import DecodeGraphs
    from medgemma_xray.pytorch_backend.prefill_graphs import PrefillGraphs

logger = logging.getLogger(__name__)

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
DEFAULT_PREFIX_CACHE_GIB = 1.0  # about 470 pages of 16 tokens at MedGemma-4B's size: 7,500 prompt tokens
PREFIX_BLOCK_TOKENS = PAGE_TOKENS  # the prefix cache's blocks are the KV pages (vLLM's default size, 16)


class FastTorchInference(TorchInference):
    executor_name = "transformers-fast"
    resumes_inside_images = True  # image rows are placed from prompt.features by position, any chunk start
    overlaps = True  # decode inputs live on the device (PagedGemmaDecoder.row_tokens): steps queue ahead

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
        vision_graph: bool | None = None,
        pixel_cache_films: int = DEFAULT_PIXEL_CACHE_FILMS,
        checkpoint: str = "auto",
    ) -> None:
        """The first-token and overlap options (None: on where CUDA graphs are, off elsewhere):
        prefill_buckets: prompt sizes a new conversation's prefill is padded to and, with CUDA graphs, replayed as
        one captured graph (pytorch_backend/prefill_graphs; () turns it off); vision_graph: the compiled
        vision tower captured as a CUDA graph for one film; pixel_cache_films: preprocessed films kept by content
        hash (preprocess_film)."""
        self.weights = weights
        super().__init__(model_path, device, max_resident_conversations, preloaded, checkpoint)
        from medgemma_xray.pytorch_backend.paged_decoder import PagedGemmaDecoder

        on_cuda = self.device.type == "cuda"
        self.use_compile = on_cuda if compile is None else compile
        self.use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        self.max_sequence = max_sequence
        self.prefill_chunk_tokens = prefill_chunk_tokens
        # Every row can grow to max_sequence on pages of its own, and the prefix cache holds up to prefix_pages
        # more: running answers never run out of pages.
        prefix_pages = int(prefix_cache_gib * 2**30) // PagedGemmaDecoder.page_bytes_for(self.model)
        pages = slots * -(-max_sequence // PAGE_TOKENS) + prefix_pages
        self.decoder = PagedGemmaDecoder(self.model, rows=slots, max_len=max_sequence, pages=pages)
        self.pages = PagePool(pages)
        self._free_rows = list(range(slots - 1, -1, -1))
        torch = self._torch
        self._tables = torch.full((slots + 1, self.decoder.max_pages), self.decoder.dummy_page, dtype=torch.int32)
        self._dirty_rows: set[int] = set()
        from medgemma_xray.pytorch_backend.busy_timer import BusyTimer

        self.busy_timer = BusyTimer()  # the benchmark's GPU-busy share: device events around each launch
        self.max_batch = max(b for b in batch_buckets if b <= slots) if slots >= 1 else 1
        self.batch_buckets = tuple(b for b in batch_buckets if b <= self.max_batch)
        self._step = self.decoder.decode
        self.fused = None  # the fused-KV-write step, and the 8-bit weight mode (pytorch_backend/fused_step)
        if fused_step or weights != "bf16":
            from medgemma_xray.pytorch_backend.fused_step import FusedDecodeStep

            self.fused = FusedDecodeStep(self.decoder, weights)
        self._graphs: DecodeGraphs | None = None
        self.decode_bucket_choices: dict[int, dict] = {}  # the 8-bit mode: which step each decode bucket runs
        self._vision_one = self.model.get_image_features  # compiled in warm-up: one film, its fixed shape
        if prefill_buckets is None:
            prefill_buckets = DEFAULT_PREFILL_BUCKETS if self.use_graphs else ()
        self.prefill_buckets = tuple(prefill_buckets)
        self._prefill_graphs: PrefillGraphs | None = None  # made in warm-up (captured there with CUDA graphs)
        self.use_vision_graph = self.use_graphs if vision_graph is None else vision_graph
        self._vision_graph: tuple | None = None  # (graph, static pixels, static features)
        self.pixel_cache = PixelCache(pixel_cache_films)
        self._warmed = False
        self.image_cache = ImageFeatureCache(int(image_cache_gib * 2**30), self.image_cache._size_of)
        self.prefix_cache = PrefixBlockCache(prefix_pages, PREFIX_BLOCK_TOKENS, release=self.pages.release)
        self.startup: dict[str, Any] = {"load_s": round(self.load_s, 2)}
        logger.info(
            "fast path: %d rows of up to %d tokens on %d KV pages of %d tokens (%.2f GiB; prefix cache up to %d), "
            "compile=%s, CUDA graphs=%s",
            slots,
            max_sequence,
            pages,
            PAGE_TOKENS,
            self.decoder.cache_bytes / 2**30,
            prefix_pages,
            self.use_compile,
            self.use_graphs,
        )

    # --- KV state: sequence rows and the pages they hold ----------------------------------------------------------
    def _allocate_impl(self):
        if not self._free_rows:
            raise NoFreeSlotError(f"all {self.decoder.rows} sequence rows are in use")
        return SequenceKV(self._free_rows.pop())

    def _truncate_impl(self, kv: SequenceKV, length: int) -> bool:
        """Keep positions 0..length-1: later pages are let go, and a shared page that the next write lands in is
        copied first (copy-on-write), so what other holders read never changes."""
        keep = -(-length // PAGE_TOKENS)
        for page in kv.pages[keep:]:
            self.pages.release(page)
        del kv.pages[keep:]
        if length % PAGE_TOKENS and kv.pages and self.pages.holders(kv.pages[-1]) > 1:
            own = self._take_page()
            with self._torch.inference_mode():
                self.decoder.copy_page(kv.pages[-1], own)
            self.pages.release(kv.pages[-1])
            kv.pages[-1] = own
        self._table_changed(kv)
        return True

    def _free_impl(self, kv: SequenceKV) -> None:
        for page in kv.pages:
            self.pages.release(page)
        kv.pages = []
        self._table_changed(kv)
        self._free_rows.append(kv.row)

    def _kv_usage(self) -> float:
        return self.pages.used / self.pages.capacity if self.pages.capacity else 0.0

    def _load_prefix_impl(self, kv: SequenceKV, pool_ids: list[int], length: int) -> None:
        """By reference: the cached pages become the conversation's first pages (no copy)."""
        if kv.pages:
            raise RuntimeError("a cached prefix goes into an empty conversation only")
        for page in pool_ids:
            self.pages.hold(page)
        kv.pages = list(pool_ids)
        self._table_changed(kv)

    def _prefix_pages_impl(self, kv: SequenceKV) -> list[int]:
        return kv.pages

    def _hold_page_impl(self, page: int) -> None:
        self.pages.hold(page)

    def _take_page(self) -> int:
        """A free page: the prefix cache's least recently used blocks, then idle conversations, make room."""
        while True:
            page = self.pages.take()
            if page is not None:
                return page
            if not (self.prefix_cache.evict_oldest() or self._reclaim_idle_conversation()):
                raise NoFreeSlotError(f"all {self.pages.capacity} KV pages are held by running answers")

    def _ensure_pages(self, kv: SequenceKV, length: int) -> None:
        """Pages for positions 0..length-1 of the conversation (the block table follows before the next launch)."""
        added = False
        while len(kv.pages) * PAGE_TOKENS < length:
            kv.pages.append(self._take_page())
            added = True
        if added:
            self._table_changed(kv)

    def _table_changed(self, kv: SequenceKV) -> None:
        row = self._tables[kv.row]
        row.fill_(self.decoder.dummy_page)
        if kv.pages:
            row[: len(kv.pages)] = self._torch.tensor(kv.pages, dtype=self._torch.int32)
        self._dirty_rows.add(kv.row)

    def _flush_tables(self) -> None:
        """Send the block-table rows that changed, queued behind the launched work (one copy)."""
        if self._dirty_rows:
            rows = sorted(self._dirty_rows)
            self._dirty_rows.clear()
            self.decoder.set_tables(rows, self._tables[rows])

    def _write_index(self, kv: SequenceKV, start: int, end: int) -> list[int]:
        """Flat cache index (page * PAGE_TOKENS + offset) of positions start..end-1."""
        pages = kv.pages
        return [pages[p // PAGE_TOKENS] * PAGE_TOKENS + p % PAGE_TOKENS for p in range(start, end)]

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
        """The films' pixels: each from the pixel cache where it was preprocessed earlier (off the loop), the rest
        computed now, in one call."""
        cached = [self.pixel_cache.get(prompt.image_key) for prompt in prompts]
        missing = [prompt for prompt, pixels in zip(prompts, cached, strict=True) if pixels is None]
        computed = iter(())
        if missing:
            with _nvtx(self, "preprocess"):
                computed = iter(self.pixel_values([prompt.image for prompt in missing]))
        if len(prompts) == 1 and cached[0] is not None:
            return cached[0]
        rows = [pixels if pixels is not None else next(computed)[None] for pixels in cached]
        return rows[0] if len(rows) == 1 else self._torch.cat(rows)

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
        with self.busy_timer.around():
            features = self._vision(self._pixels(prompts))
        for prompt, row in zip(prompts, features, strict=True):
            # Own memory per film: the image cache keeps rows, and a view would pin the whole batch.
            prompt.features = row if features.shape[0] == 1 else row.clone()

    def _prefill_impl(self, kv: SequenceKV, prompt: Prompt, start: int, end: int, want_token: bool):
        return self._launch_prefill_impl([(kv, prompt, start, end, want_token)]).wait()[0]

    def _prefill_batch_impl(self, items: list) -> list[TokenStep | None]:
        return self._launch_prefill_impl(items).wait()

    def _launch_prefill_impl(self, items: list) -> Readback:
        """Every chunk in one packed forward (one attention kernel per layer for all of them); a new
        conversation's whole prompt alone, when it fits a bucket, through the bucket's captured graph instead.
        Each last chunk's first token stays in its row's device state; the host reads it from the Readback."""
        with self.busy_timer.around():
            return self._queue_prefill(items)

    def _queue_prefill(self, items: list) -> Readback:
        torch = self._torch
        for kv, _, _, end, _ in items:
            self._ensure_pages(kv, end)
        self._flush_tables()
        if len(items) == 1 and self._prefill_graphs is not None:
            kv, prompt, start, end, want_token = items[0]
            if start == 0 and want_token and self._prefill_graphs.bucket_for(end) is not None:
                ids, logprobs = self._prefill_bucketed(kv, prompt, end)
                return Readback(ids, logprobs, [0])
        wanted = [index for index, item in enumerate(items) if item[4]]
        with torch.inference_mode():
            result = self._run_packed(items, wanted)
        if result is None:
            return Readback(None, None, [None] * len(items))
        index: list[int | None] = [None] * len(items)
        for row, item in enumerate(wanted):
            index[item] = row
        ids, logprobs = result
        return Readback(ids, logprobs, index)

    def _prefill_bucketed(self, kv: SequenceKV, prompt: Prompt, end: int):
        torch = self._torch
        graphs = self._prefill_graphs
        assert graphs is not None  # the caller checked
        with _nvtx(self, "prefill.embed"), torch.inference_mode():
            ids = prompt.ids[:end]
            rows, blocks = image_rows(ids, self.image_token_id)
            embeds = self.decoder.embed(_on(torch.tensor(ids), self.device))
            if rows:
                # The i-th image token takes feature row i: the films' rows in prompt order (a prior's first).
                features = prompt.features.reshape(-1, prompt.features.shape[-1]).to(self.dtype)
                index = _on(torch.tensor(rows), self.device)
                embeds[index] = features[: len(rows)]
        with _nvtx(self, "prefill.graph"), torch.inference_mode():
            return graphs.run(kv.row, embeds, blocks)

    def _prompt_logits_impl(self, kv: SequenceKV, prompt: Prompt):
        return self._run_prompt(kv, prompt, 0, len(prompt.ids))[0].float().cpu().numpy()

    def _run_prompt(self, kv: SequenceKV, prompt: Prompt, start: int, end: int):
        """Logits (1, vocab) of prompt.ids[end-1] after feeding start..end-1 (the weight gate uses it)."""
        self._ensure_pages(kv, end)
        self._flush_tables()
        chunk, embeds, write_index = self._chunk_inputs(kv, prompt, start, end)
        with self._torch.inference_mode():
            return self.decoder.prompt_logits(chunk, embeds, write_index)[None]

    def _chunk_inputs(self, kv: SequenceKV, prompt: Prompt, start: int, end: int):
        """(PrefillChunk, embeddings (end - start, hidden), flat write index) of one chunk, from host ids only:
        the film's feature rows are placed by the image tokens' positions (nothing is read back)."""
        from medgemma_xray.pytorch_backend.prefill_attention import PrefillChunk

        torch = self._torch
        rows, blocks = image_rows(prompt.ids[:end], self.image_token_id)
        embeds = self.decoder.embed(_on(torch.tensor(prompt.ids[start:end]), self.device))
        inside = [row for row in rows if row >= start]
        if inside:
            # The i-th image token of the prompt takes feature row i (the films' rows in prompt order, a prior's
            # first), so the rows of this chunk's image tokens follow those of the image tokens before it.
            features = prompt.features.reshape(-1, prompt.features.shape[-1]).to(self.dtype)
            first = len(rows) - len(inside)
            index = _on(torch.tensor(inside), self.device)
            embeds[index - start] = features[first : len(rows)]
        write_index = _on(torch.tensor(self._write_index(kv, start, end)), self.device)
        return PrefillChunk(kv.row, start, end, blocks), embeds, write_index

    def _run_packed(self, items: list, wanted: list[int]):
        chunks, embeds, writes = [], [], []
        for kv, prompt, start, end, _ in items:
            chunk, chunk_embeds, write_index = self._chunk_inputs(kv, prompt, start, end)
            chunks.append(chunk)
            embeds.append(chunk_embeds)
            writes.append(write_index)
        torch = self._torch
        packed = embeds[0] if len(embeds) == 1 else torch.cat(embeds)
        write_index = writes[0] if len(writes) == 1 else torch.cat(writes)
        with _nvtx(self, "prefill.packed"):
            return self.decoder.prefill_packed(chunks, packed, write_index, wanted)

    def _launch_decode_impl(self, kvs: list, positions: list[int]) -> Readback:
        """One step for every row, fed from the rows' device state; nothing waits for the device here."""
        for kv, position in zip(kvs, positions, strict=True):
            self._ensure_pages(kv, position + 1)
        self._flush_tables()
        rows = [kv.row for kv in kvs]
        torch = self._torch
        with _nvtx(self, "decode"), torch.inference_mode(), self.busy_timer.around():
            if self._graphs is not None:
                ids, logprobs = self._graphs.run(rows)
            else:
                ids, logprobs = self.decoder.advance(self._step, _on(torch.tensor(rows), self.device))
            return Readback(ids, logprobs, list(range(len(rows))))

    def _decode_impl(self, kvs: list, tokens: list[int], positions: list[int]) -> list[TokenStep]:
        """A step fed from the host (the contract's synchronous path, and the checks that compare steps)."""
        for kv, position in zip(kvs, positions, strict=True):
            self._ensure_pages(kv, position + 1)
        self._flush_tables()
        torch = self._torch
        as_tensor = lambda values: _on(torch.tensor(values), self.device)  # noqa: E731
        with torch.inference_mode():
            ids, logprobs = self._step(as_tensor(tokens), as_tensor(positions), as_tensor([kv.row for kv in kvs]))
            ids, logprobs = ids.tolist(), logprobs.tolist()
        return [TokenStep(t, p) for t, p in zip(ids, logprobs, strict=True)]

    # --- start-up: compile and capture before readiness ----------------------------------------------------------
    def _warm_up_impl(self) -> None:
        if self._warmed:  # a second warm-up (a service loading an already-warm backend): one answer, no recapture
            super()._warm_up_impl()
            return
        torch = self._torch
        if self.fused is not None:  # gates an 8-bit mode (refused: WeightModeRefused), compiles the step
            from medgemma_xray.pytorch_backend.weight_gate import start_fused_step

            self._step = start_fused_step(self)
        if self.use_compile:
            # One compiled graph per layer type (and batch 1 vs any batch), reused by all 34 layers: the whole
            # step compiled as one graph took over two minutes per batch shape on an H200 host.
            decoder = self.decoder
            # (the compiled functions replace the bound methods on this instance: that is the point)
            decoder.layer_step = torch.compile(decoder.layer_step, dynamic=True)  # type: ignore[method-assign]
            decoder.sample = torch.compile(decoder.sample, dynamic=True)  # type: ignore[method-assign]
            # Prefill: the token-wise parts of a layer, one graph each for any packed token count (the attention
            # between them is one Triton kernel for every chunk), reused by all 34 layers.
            decoder.prefill_qkv = torch.compile(decoder.prefill_qkv, dynamic=True)  # type: ignore[method-assign]
            decoder.prefill_out = torch.compile(decoder.prefill_out, dynamic=True)  # type: ignore[method-assign]
            self._vision_one = torch.compile(self.model.get_image_features)
        started = time.perf_counter()
        super()._warm_up_impl()  # one answer: compiles the vision tower and (without graphs) the step
        self.startup["first_answer_s"] = round(time.perf_counter() - started, 2)
        if self.use_graphs:
            from medgemma_xray.pytorch_backend.cuda_graphs import DecodeGraphs

            started = time.perf_counter()
            alternatives: dict[str, Any] | None = None
            if self.weights != "bf16":  # each bucket runs the faster of the 8-bit step and the bf16 step
                alternatives = {"bf16": self.decoder.decode}
            self._graphs = DecodeGraphs(
                self.decoder, self._step, self.batch_buckets, self.device, alternatives, name=self.weights
            )
            if self._graphs.choices:
                self.startup["decode_buckets"] = {str(b): c["runs"] for b, c in self._graphs.choices.items()}
                self.decode_bucket_choices = self._graphs.choices
            self.startup["capture_s"] = round(time.perf_counter() - started, 2)
        started = time.perf_counter()
        self._warm_up_first_token()
        self.startup["first_token_capture_s"] = round(time.perf_counter() - started, 2)
        if self.use_graphs or self._prefill_graphs is not None:
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
                    self.decoder, self.prefill_buckets, self.use_graphs, self.decoder.dummy_row
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
                "slots": self.decoder.rows,
                "kv_pages": self.pages.capacity,
                "kv_page_tokens": PAGE_TOKENS,
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
                "overlap": self.overlaps,
                "decode_bucket_choices": {str(b): c for b, c in self.decode_bucket_choices.items()},
                "startup": self.startup,
            }
        )
        return info


def _on(host, device):
    """A host tensor on the device without a host wait (pinned, then an asynchronous copy) where it is CUDA."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _nvtx(backend, name: str):
    """An NVTX range on CUDA (what an Nsight Systems trace shows per part), nothing on CPU."""
    if backend.device.type == "cuda":
        return backend._torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()
