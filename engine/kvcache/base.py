"""The prefix cache interface shared by the radix tree and the no-sharing baseline."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import numpy as np
import torch


class MatchResult(NamedTuple):
    length: int  # matched tokens, a multiple of page_size
    locations: torch.Tensor  # (length,) int64 KV locations of the matched tokens
    handle: Any  # pass to lock/unlock


class CacheSizes(NamedTuple):
    evictable_pages: int  # cached, no running request uses them
    protected_pages: int  # cached and locked by at least one running request


class PrefixCache(ABC):
    """Owns KV pages of finished requests so later requests can reuse them.

    Pages a request reuses stay locked (protected) until the request releases them; unlocked pages
    are evictable and go back to the allocator, least recently used first, when pages run short.
    """

    shares = True  # whether inserted pages can be matched by later requests

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    @abstractmethod
    def match(self, tokens: np.ndarray) -> MatchResult:
        """Longest cached prefix of `tokens` (int32, (n,)), page-aligned. Does not lock."""

    @abstractmethod
    def lock(self, handle: Any) -> None:
        """Protect the matched prefix (ref-counted) from eviction."""

    @abstractmethod
    def unlock(self, handle: Any) -> None:
        """Undo one `lock`; at zero references the pages become evictable."""

    @abstractmethod
    def insert(self, tokens: np.ndarray, locations: torch.Tensor) -> int:
        """Take ownership of `locations` for `tokens` (page-aligned length).

        Returns how many leading tokens were already cached: the caller frees its own copies of
        those pages (beyond the part it had matched), since the cache keeps its existing ones.
        """

    @abstractmethod
    def evict(self, num_pages: int) -> list[int]:
        """Drop at least `num_pages` evictable pages (fewer if not enough) and return their ids."""

    @abstractmethod
    def sizes(self) -> CacheSizes: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Assert internal invariants (ref counts >= 0, page alignment, size bookkeeping)."""
