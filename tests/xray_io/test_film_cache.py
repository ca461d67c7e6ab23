"""The bounded full-resolution film cache (issue 19, section 2): shared by content hash, never over its budget,
least recently used first out, a film bigger than the budget never kept."""

import numpy as np

from medgemma_xray.xray_io.film_cache import FilmCache, content_key
from medgemma_xray.xray_io.radiograph import Radiograph


def film(side: int, value: int) -> Radiograph:
    return Radiograph(np.full((side, side), value, dtype=np.uint8), "test")


def test_budget_lru_and_sharing():
    cache = FilmCache(budget_bytes=3 * 100 * 100)
    keys = [content_key(bytes([i]) * 10) for i in range(4)]
    for index, key in enumerate(keys[:3]):
        assert cache.put(key, film(100, index))
    assert cache.get(keys[0]).pixels[0, 0] == 0  # now the most recently used
    assert cache.put(keys[3], film(100, 3))
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is not None
    assert cache.held_bytes == 3 * 100 * 100
    assert not cache.put(content_key(b"huge"), film(200, 9))
    assert cache.held_bytes <= cache.budget_bytes
    assert content_key(b"same bytes") == content_key(b"same bytes")
