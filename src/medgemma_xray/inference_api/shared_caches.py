"""Caches shared by every conversation and user of one backend: the vision tower's output and the KV of common
prompt prefixes. Torch-free bookkeeping; the backend owns the memory the entries point at.

Keys follow vLLM's (`docs/design/prefix_caching.md`, its multi-modal encoder cache):
- an image's key is a content hash of its pixels (blake2b-128 over mode, size and bytes), never a file name;
- a prefix block's key chains from its parent's key and its token ids, and the chain starts from the film's
  content hash. Image soft tokens have one id for every film, so without the root two films with the same question
  would share KV; with it they never do. Each block also keeps its parent key, root and token ids, and a lookup
  compares them, so even a colliding chain hash cannot hand one film's KV to another.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

TEXT_ONLY_ROOT = "text-only"


def image_content_hash(image: Any) -> str:
    """A collision-resistant key of the pixels the model will read (about 2 ms for 896x896 RGB)."""
    data = image.tobytes() if hasattr(image, "tobytes") else bytes(image)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{getattr(image, 'mode', '')}|{getattr(image, 'size', len(data))}|".encode())
    digest.update(data)
    return digest.hexdigest()


@dataclass
class CacheCounters:
    """Queries and hits as vLLM counts them: images for the encoder cache, prompt tokens for the prefix cache."""

    queries: int = 0
    hits: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"queries": self.queries, "hits": self.hits, "evictions": self.evictions}


class ImageFeatureCache:
    """The vision tower's output per film, least recently used evicted beyond `capacity_bytes`.

    Values are opaque (a device tensor, a numpy array); `size_of` says what each costs. A caller's hint (a DICOM's
    SOPInstanceUID) maps to the content hash it was last seen with; a hint that now names other pixels is counted
    as a mismatch and ignored, so the hash alone decides."""

    def __init__(self, capacity_bytes: int, size_of: Callable[[Any], int]) -> None:
        self.capacity_bytes = max(0, int(capacity_bytes))
        self._size_of = size_of
        self._entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._hints: OrderedDict[str, str] = OrderedDict()
        self.used_bytes = 0
        self.counters = CacheCounters()
        self.hint_mismatches = 0
        self.encoder_calls = 0  # films that went through the vision tower (misses, counted by the contract)

    def get(self, key: str, hint: str | None = None) -> Any | None:
        self.counters.queries += 1
        if hint is not None:
            seen = self._hints.get(hint)
            if seen is not None and seen != key:
                self.hint_mismatches += 1
                logger.warning("an image hint named different pixels than before; the content hash decides")
            self._hints[hint] = key
            self._hints.move_to_end(hint)
            while len(self._hints) > 4096:
                self._hints.popitem(last=False)
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        self.counters.hits += 1
        return entry[0]

    def put(self, key: str, value: Any) -> None:
        size = int(self._size_of(value))
        if size > self.capacity_bytes or key in self._entries:
            return
        self._entries[key] = (value, size)
        self.used_bytes += size
        while self.used_bytes > self.capacity_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used_bytes -= evicted
            self.counters.evictions += 1

    def clear(self) -> None:
        self._entries.clear()
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, Any]:
        return {
            **self.counters.as_dict(),
            "entries": len(self._entries),
            "used_bytes": self.used_bytes,
            "capacity_bytes": self.capacity_bytes,
            "hint_mismatches": self.hint_mismatches,
            "encoder_calls": self.encoder_calls,
        }


@dataclass
class _Block:
    pool_id: int
    parent: bytes | None
    root: str
    ids: tuple[int, ...]


class PrefixBlockCache:
    """Which block holds the KV of which prompt block, least recently used evicted. Two ways to hold them:

    - copy (`release` None): the backend owns a pool of `capacity_blocks` blocks of `block_tokens` tokens each; this
      class lends pool ids (`reserve`), the backend copies a prompt's blocks in after its prefill and copies cached
      blocks into a new conversation's KV at admission (copy-on-admit);
    - by reference (`release` given, a paged KV cache): the cache adopts the conversation's own pages (`adopt`),
      holding each once, at most `capacity_blocks` of them; a new conversation on the same film reads the same
      pages through its block table, and eviction calls `release(page)`, so a page lives while anyone holds it.
    Either way a lookup finds the longest cached run of a prompt's leading full blocks."""

    def __init__(self, capacity_blocks: int, block_tokens: int, release: Callable[[int], None] | None = None) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.capacity_blocks = max(0, int(capacity_blocks))
        self.block_tokens = int(block_tokens)
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        self._release = release
        self._free = [] if release is not None else list(range(self.capacity_blocks - 1, -1, -1))
        self.counters = CacheCounters()

    @property
    def by_reference(self) -> bool:
        return self._release is not None

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    def chain(self, root: str, ids: Sequence[int]) -> list[bytes]:
        """The key of each full block of `ids`, each chained from the previous one and from `root`."""
        keys, parent = [], root.encode()
        size = self.block_tokens
        for start in range(0, len(ids) - size + 1, size):
            digest = hashlib.blake2b(parent, digest_size=16)
            digest.update(b",".join(str(token).encode() for token in ids[start : start + size]))
            parent = digest.digest()
            keys.append(parent)
        return keys

    def lookup(self, root: str, ids: Sequence[int], limit_tokens: int) -> list[int]:
        """Pool ids of the longest cached run of leading blocks, at most limit_tokens tokens; counts the query."""
        self.counters.queries += len(ids)
        found: list[int] = []
        if not self.enabled:
            return found
        parent: bytes | None = None
        size = self.block_tokens
        for index, key in enumerate(self.chain(root, ids[: max(0, limit_tokens)])):
            block = self._blocks.get(key)
            expected = tuple(ids[index * size : (index + 1) * size])
            if block is None or block.parent != parent or block.root != root or block.ids != expected:
                break
            self._blocks.move_to_end(key)
            found.append(block.pool_id)
            parent = key
        self.counters.hits += len(found) * size
        return found

    def reserve(self, root: str, ids: Sequence[int], cached_blocks: int) -> list[tuple[int, int]]:
        """Pool ids for the full blocks of `ids` not cached yet, after the first `cached_blocks`, evicting the least
        recently used. Returns (block index in the prompt, pool id) pairs the backend must fill now."""
        if not self.enabled:
            return []
        keys = self.chain(root, ids)
        size = self.block_tokens
        wanted, parent = [], keys[cached_blocks - 1] if cached_blocks else None
        for index in range(cached_blocks, len(keys)):
            key = keys[index]
            existing = self._blocks.get(key)
            if existing is None:
                pool_id = self._take(protect=set(keys[:index]))
                if pool_id is None:
                    break
                self._blocks[key] = _Block(pool_id, parent, root, tuple(ids[index * size : (index + 1) * size]))
                wanted.append((index, pool_id))
            else:
                self._blocks.move_to_end(key)
            parent = key
        return wanted

    def adopt(self, root: str, ids: Sequence[int], pages: Sequence[int], hold: Callable[[int], None]) -> int:
        """By reference: the pages holding `ids`' full blocks (pages[i] holds block i) become the cached KV of the
        blocks not cached yet; `hold(page)` is called once for each page adopted. Returns how many were adopted."""
        if self._release is None:
            raise RuntimeError("adopt() is for a cache that holds pages by reference; this one copies (reserve)")
        if not self.enabled:
            return 0
        keys = self.chain(root, ids)
        size = self.block_tokens
        adopted, parent = 0, None
        for index, key in enumerate(keys[: len(pages)]):
            existing = self._blocks.get(key)
            if existing is None:
                if len(self._blocks) >= self.capacity_blocks and not self._evict(protect=set(keys[:index])):
                    break
                hold(pages[index])
                self._blocks[key] = _Block(pages[index], parent, root, tuple(ids[index * size : (index + 1) * size]))
                adopted += 1
            else:
                self._blocks.move_to_end(key)
            parent = key
        return adopted

    def evict_oldest(self) -> bool:
        """Drop the least recently used block (its page is released by reference). False when the cache is empty."""
        return self._evict(protect=set())

    def _evict(self, protect: set[bytes]) -> bool:
        for key in self._blocks:  # oldest first; never a block of the chain being written
            if key not in protect:
                block = self._blocks.pop(key)
                self.counters.evictions += 1
                if self._release is not None:
                    self._release(block.pool_id)
                return True
        return False

    def _take(self, protect: set[bytes]) -> int | None:
        if self._free:
            return self._free.pop()
        for key in self._blocks:  # oldest first; never a block of the chain being written
            if key not in protect:
                block = self._blocks.pop(key)
                self.counters.evictions += 1
                return block.pool_id
        return None

    def clear(self) -> None:
        if self._release is not None:
            for block in self._blocks.values():
                self._release(block.pool_id)
            self._blocks.clear()
            return
        self._blocks.clear()
        self._free = list(range(self.capacity_blocks - 1, -1, -1))

    @property
    def used_blocks(self) -> int:
        return len(self._blocks)

    def stats(self) -> dict[str, Any]:
        return {
            **self.counters.as_dict(),
            "blocks_used": len(self._blocks),
            "blocks_capacity": self.capacity_blocks,
            "block_tokens": self.block_tokens,
            "by_reference": self.by_reference,
        }
