"""KV storage: the paged pool, page allocator, slot tables and prefix caches (by name)."""

from __future__ import annotations

from radixserve.engine.kvcache.base import CacheSizes, MatchResult, PrefixCache


def create_prefix_cache(kind: str, page_size: int) -> PrefixCache:
    if kind == "radix":
        from radixserve.engine.kvcache.radix import RadixPrefixCache

        return RadixPrefixCache(page_size)
    if kind == "naive":
        from radixserve.engine.kvcache.naive import NaivePrefixCache

        return NaivePrefixCache(page_size)
    raise ValueError(f"unknown prefix cache {kind!r}; choose 'radix' or 'naive'")


__all__ = ["CacheSizes", "MatchResult", "PrefixCache", "create_prefix_cache"]
