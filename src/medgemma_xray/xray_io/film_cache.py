"""Full-resolution films by content hash, under a byte budget: for a viewer that shows the film at its native
resolution (a teaching feature) without each session holding its own copy (issue 19, section 2).

Sessions keep only the model's 896-px input; a viewer asks here by the hash of the uploaded bytes. Many students
on one film share one entry; the least recently used entries go first when the budget is reached, and a film
larger than the whole budget is not kept at all. Thread-safe; nothing here decodes.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from medgemma_xray.xray_io.radiograph import Radiograph


def content_key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FilmCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._films: OrderedDict[str, Radiograph] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def put(self, key: str, film: Radiograph) -> bool:
        """Keep `film` under `key`; False if it alone exceeds the budget (then it is not kept)."""
        size = film.pixels.nbytes
        if size > self.budget_bytes:
            return False
        with self._lock:
            old = self._films.pop(key, None)
            if old is not None:
                self._held -= old.pixels.nbytes
            self._films[key] = film
            self._held += size
            while self._held > self.budget_bytes:
                _, evicted = self._films.popitem(last=False)
                self._held -= evicted.pixels.nbytes
        return True

    def get(self, key: str) -> Radiograph | None:
        with self._lock:
            film = self._films.get(key)
            if film is not None:
                self._films.move_to_end(key)
            return film

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._held
