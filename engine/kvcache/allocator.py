"""Free KV pages. The only code that hands pages out or takes them back."""

from __future__ import annotations

import torch


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        # Low page ids are handed out first (pop from the end of a reversed list).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        assert 0 <= n <= len(self._free), f"asked for {n} pages, {len(self._free)} free"
        pages = self._free[len(self._free) - n :][::-1]
        del self._free[len(self._free) - n :]
        for p in pages:
            self._is_free[p] = 0
        return pages

    def free(self, pages: list[int] | torch.Tensor) -> None:
        if isinstance(pages, torch.Tensor):
            pages = pages.tolist()
        for p in pages:
            assert not self._is_free[p], f"double free of page {p}"
            self._is_free[p] = 1
        self._free.extend(pages)
