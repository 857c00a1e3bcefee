"""Radix-tree prefix cache: shared prompt prefixes keep one copy of their KV pages.

The tree lives in C++ (native/radix_tree.cpp), which owns the nodes, lock counts, LRU order and
sizes; this class only converts between torch and the numpy buffers the C ABI takes. When the
compiled module is missing, `RadixPrefixCache` is the pure-Python twin (radix_py.py) instead, and
importing radixserve.native has already warned once.

Each edge holds a run of tokens (a multiple of page_size) and their KV locations. Lock counts run
root-ward: locking a node locks its whole path. Evictable leaves sit in a heap ordered by last
access, so eviction never scans the tree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from radixserve.engine.kvcache.base import CacheSizes, MatchResult, PrefixCache
from radixserve.engine.kvcache.radix_py import PyRadixPrefixCache
from radixserve.native import NATIVE_AVAILABLE
from radixserve.native.radix_tree import RadixTree


class CppRadixPrefixCache(PrefixCache):
    """Handles are ints naming a node and its generation: a stale one raises ValueError."""

    backend = "cpp"

    def __init__(self, page_size: int) -> None:
        self._tree = RadixTree(page_size)  # checks page_size
        super().__init__(page_size)

    def match(self, tokens: np.ndarray) -> MatchResult:
        length, locations, handle = self._tree.match(tokens)
        return MatchResult(length, torch.from_numpy(locations), handle)  # (length,) int64, cpu

    def lock(self, handle: Any) -> None:
        self._tree.lock(handle)

    def unlock(self, handle: Any) -> None:
        self._tree.unlock(handle)

    def insert(self, tokens: np.ndarray, locations: torch.Tensor) -> int:
        return self._tree.insert(tokens, locations)

    def evict(self, num_pages: int) -> list[int]:
        return self._tree.evict(num_pages)

    def sizes(self) -> CacheSizes:
        return CacheSizes(*self._tree.sizes())

    def check_integrity(self) -> None:
        self._tree.check_integrity()

    def pages(self) -> list[int]:
        """Every page the cache holds (for tests of the pool invariant)."""
        return self._tree.pages()


RadixPrefixCache: type[PrefixCache] = (
    CppRadixPrefixCache if NATIVE_AVAILABLE else PyRadixPrefixCache
)

__all__ = ["CppRadixPrefixCache", "PyRadixPrefixCache", "RadixPrefixCache"]
