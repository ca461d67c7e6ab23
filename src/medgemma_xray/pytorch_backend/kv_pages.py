"""Host bookkeeping of the paged KV cache: which pages are free, how many holders each page has, and which pages
each sequence row reads.

A page is held by every conversation whose block table names it and by the prefix cache while it caches it (vLLM's
reference-counted blocks). A page is free again when its last holder lets go; only a page with one holder may be
written, so a conversation that must write into a shared page copies it first (copy-on-write).
"""

from __future__ import annotations


class PagePool:
    def __init__(self, pages: int) -> None:
        self.capacity = pages
        self._holders = [0] * pages
        self._free = list(range(pages - 1, -1, -1))

    def take(self) -> int | None:
        """A free page, held once; None when every page is held."""
        if not self._free:
            return None
        page = self._free.pop()
        self._holders[page] = 1
        return page

    def hold(self, page: int) -> None:
        if self._holders[page] <= 0:
            raise RuntimeError(f"KV page {page} is free; only a held page can gain a holder")
        self._holders[page] += 1

    def release(self, page: int) -> None:
        holders = self._holders[page] - 1
        if holders < 0:
            raise RuntimeError(f"KV page {page} was released more often than it was held")
        self._holders[page] = holders
        if holders == 0:
            self._free.append(page)

    def holders(self, page: int) -> int:
        return self._holders[page]

    @property
    def used(self) -> int:
        return self.capacity - len(self._free)


class SequenceKV:
    """One conversation's KV: its sequence row (device state and block table) and the pages it holds, in order."""

    __slots__ = ("pages", "row")

    def __init__(self, row: int) -> None:
        self.row = row
        self.pages: list[int] = []
