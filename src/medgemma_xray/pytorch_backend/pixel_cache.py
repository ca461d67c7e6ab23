"""The vision tower's input (resized, normalised pixels) by the film's content hash, filled off the answer's path.

The processor's resize and normalise took 8.9 ms on the CPU per film (H200 host, 2026-12-01), inside the first
token's time, on the thread that runs every answer's steps. A caller that has the film earlier (the scheduler's
submitting thread, an upload handler) calls FastTorchInference.preprocess_film(image, key); the question's
prefill then finds the pixels here. Enough entries for a class arriving at once (a film is asked about right after
it arrives, but 48 students' films can wait behind each other for a turn); the vision tower's output has its own,
larger cache (medgemma_xray.inference_api.shared_caches.ImageFeatureCache). Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

DEFAULT_PIXEL_CACHE_FILMS = 96  # 896x896x3 bf16 on the device: 4.8 MB each, 460 MB for a class of 96


class PixelCache:
    def __init__(self, capacity: int = DEFAULT_PIXEL_CACHE_FILMS) -> None:
        if capacity < 0:
            raise ValueError(f"the pixel cache's capacity must be 0 or more films, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str | None) -> Any:
        """The cached pixels of `key` (most recently used now), or None."""
        with self._lock:
            if key is None or key not in self._entries:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key]

    def put(self, key: str, pixels: Any) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._entries[key] = pixels
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
