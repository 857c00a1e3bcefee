"""Allocator and prefix-cache invariants with synthetic token ids (no model)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from radixserve.engine.kvcache import create_prefix_cache
from radixserve.engine.kvcache.allocator import PageAllocator
from radixserve.engine.kvcache.radix import (
    CppRadixPrefixCache,
    PyRadixPrefixCache,
    RadixPrefixCache,
)

# Every radix test runs on the C++ tree and on its pure-Python twin.
BACKENDS = pytest.mark.parametrize("Cache", [CppRadixPrefixCache, PyRadixPrefixCache])


def toks(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def locs_for(pages: list[int], page_size: int) -> torch.Tensor:
    return (torch.tensor(pages)[:, None] * page_size + torch.arange(page_size)).flatten()


def test_allocator_hands_out_and_takes_back():
    a = PageAllocator(8)
    got = a.alloc(3)
    assert got == [0, 1, 2] and a.num_free == 5
    a.free(got)
    assert a.num_free == 8
    with pytest.raises(AssertionError, match="double free"):
        a.free([got[0]])
    with pytest.raises(AssertionError):
        a.alloc(9)


@BACKENDS
def test_radix_match_insert_split_page1(Cache: type) -> None:
    c = Cache(1)
    assert c.insert(toks(1, 2, 3, 4), torch.tensor([10, 11, 12, 13])) == 0
    m = c.match(toks(1, 2, 9))
    assert m.length == 2 and m.locations.tolist() == [10, 11]
    # Inserting a sequence sharing 2 tokens reports them as already cached.
    assert c.insert(toks(1, 2, 7), torch.tensor([20, 21, 22])) == 2
    assert c.sizes().evictable_pages == 5
    c.check_integrity()


@BACKENDS
def test_radix_is_page_granular(Cache: type) -> None:
    P = 4
    c = Cache(P)
    c.insert(toks(*range(8)), locs_for([3, 5], P))
    m = c.match(toks(0, 1, 2, 3, 4, 5, 99, 7))  # mismatch inside the second page
    assert m.length == 4 and m.locations.tolist() == locs_for([3], P).tolist()
    assert c.match(toks(0, 1, 2)).length == 0  # less than a page never matches
    c.check_integrity()


@BACKENDS
def test_locks_protect_and_unlock_releases(Cache: type) -> None:
    c = Cache(1)
    c.insert(toks(1, 2, 3), torch.tensor([0, 1, 2]))
    m = c.match(toks(1, 2))
    c.lock(m.handle)
    assert c.sizes() == (1, 2)  # the split-off tail stays evictable
    assert sorted(c.evict(10)) == [2]
    assert c.evict(10) == []  # the locked part cannot go
    c.unlock(m.handle)
    assert c.sizes() == (2, 0)
    assert sorted(c.evict(10)) == [0, 1]
    c.check_integrity()


@BACKENDS
def test_eviction_is_least_recently_used_first(Cache: type) -> None:
    c = Cache(1)
    c.insert(toks(1, 1), torch.tensor([0, 1]))
    c.insert(toks(2, 2), torch.tensor([2, 3]))
    c.insert(toks(3, 3), torch.tensor([4, 5]))
    c.match(toks(1, 1))  # touch the oldest: it becomes the newest
    assert sorted(c.evict(2)) == [2, 3]
    assert sorted(c.evict(2)) == [4, 5]
    assert sorted(c.evict(2)) == [0, 1]


@BACKENDS
def test_eviction_cascades_to_parents(Cache: type) -> None:
    c = Cache(1)
    c.insert(toks(1, 2, 3), torch.tensor([0, 1, 2]))
    c.insert(toks(1, 2, 4), torch.tensor([0, 1, 3]))  # splits at 2: parent [1,2], leaves [3], [4]
    assert sorted(c.evict(4)) == [0, 1, 2, 3]
    assert c.sizes() == (0, 0)
    c.check_integrity()


@BACKENDS
def test_random_workload_keeps_pages_accounted(Cache: type) -> None:
    """Random inserts / matches / locks / evictions: every page is free, cached or held, once."""
    rng = random.Random(0)
    P, num_pages = 2, 64
    alloc, cache = PageAllocator(num_pages), Cache(P)
    locked = []
    for _ in range(400):
        op = rng.random()
        seq = toks(*[rng.randrange(4) for _ in range(rng.randrange(1, 8) * P)])
        if op < 0.5:
            m = cache.match(seq)
            n_new = (len(seq) - m.length) // P
            if alloc.num_free < n_new:
                alloc.free(cache.evict(n_new - alloc.num_free))
            if alloc.num_free < n_new:
                continue
            new = alloc.alloc(n_new)
            full = torch.cat([m.locations, locs_for(new, P)]) if new else m.locations
            already = cache.insert(seq, full)
            alloc.free((full[m.length : already : P] // P).tolist())
        elif op < 0.7:
            m = cache.match(seq)
            cache.lock(m.handle)
            locked.append(m.handle)
        elif op < 0.85 and locked:
            cache.unlock(locked.pop(rng.randrange(len(locked))))
        else:
            alloc.free(cache.evict(rng.randrange(1, 6)))
        cache.check_integrity()
        held = cache.pages()
        assert len(held) == len(set(held)), "a page is cached twice"
        assert len(held) + alloc.num_free == num_pages
        assert sum(cache.sizes()) == len(held)
    for h in locked:
        cache.unlock(h)
    alloc.free(cache.evict(num_pages))
    assert alloc.num_free == num_pages


def test_naive_cache_never_shares():
    c = create_prefix_cache("naive", 4)
    assert c.match(toks(*range(8))).length == 0
    assert c.insert(toks(*range(8)), torch.arange(8)) == 8  # caller frees everything
    assert c.sizes() == (0, 0)
    with pytest.raises(ValueError):
        create_prefix_cache("lru", 4)


def test_radix_uses_the_cpp_tree():
    from radixserve import native
    from radixserve.native.radix_tree import RadixTree

    assert native.NATIVE_AVAILABLE, "the C++ module was not built by the package install"
    assert RadixPrefixCache is CppRadixPrefixCache
    cache = create_prefix_cache("radix", 4)
    assert isinstance(cache, CppRadixPrefixCache) and isinstance(cache._tree, RadixTree)
