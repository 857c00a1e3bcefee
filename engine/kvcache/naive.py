"""The no-sharing baseline: nothing is ever reused, every page goes straight back."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from radixserve.engine.kvcache.base import CacheSizes, MatchResult, PrefixCache


class NaivePrefixCache(PrefixCache):
    shares = False
    def match(self, tokens: np.ndarray) -> MatchResult:
        return MatchResult(0, torch.empty(0, dtype=torch.int64), None)

    def lock(self, handle: Any) -> None:
        pass

    def unlock(self, handle: Any) -> None:
        pass

    def insert(self, tokens: np.ndarray, locations: torch.Tensor) -> int:
        return len(tokens)  # "already cached": the caller frees every page itself

    def evict(self, num_pages: int) -> list[int]:
        return []

    def sizes(self) -> CacheSizes:
        return CacheSizes(0, 0)

    def check_integrity(self) -> None:
        pass
