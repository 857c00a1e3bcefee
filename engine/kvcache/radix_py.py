"""Pure-Python twin of the C++ radix tree: used only when the compiled module is missing.

It is also the reference the property tests hold the C++ tree (native/radix_tree.cpp) to: same
results, same LRU order, same errors (the argument checks are shared, native/radix_tree.py).

Each edge holds a run of tokens (a multiple of page_size) and their KV locations. Lock counts run
root-ward: locking a node locks its whole path. Evictable leaves sit in a heap ordered by last
access, so eviction never scans the tree; stale heap entries are skipped or re-queued when popped.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import numpy as np
import torch
from radixserve.engine.kvcache.base import CacheSizes, MatchResult, PrefixCache
from radixserve.native.radix_tree import (
    HANDLE_MESSAGE,
    UNLOCK_MESSAGE,
    check_insert,
    check_num_pages,
    check_page_size,
    check_tokens,
)


def _first_mismatch(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first position where a and b differ, or min(len(a), len(b)) if none does."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class _Node:
    __slots__ = ("key", "value", "children", "parent", "ref", "last_access")

    def __init__(self, key: np.ndarray, value: torch.Tensor, parent: _Node | None) -> None:
        self.key = key  # (n,) int32 token ids
        self.value = value  # (n,) int64 KV locations
        self.children: dict[bytes, _Node] = {}
        self.parent = parent
        self.ref = 0
        self.last_access = 0


class PyRadixPrefixCache(PrefixCache):
    backend = "python"

    def __init__(self, page_size: int) -> None:
        super().__init__(check_page_size(page_size))
        self.root = _Node(np.empty(0, np.int32), torch.empty(0, dtype=torch.int64), None)
        self.root.ref = 1  # never evicted
        self._clock = itertools.count(1)
        self._heap: list[tuple[int, int, _Node]] = []
        self._tie = itertools.count()
        self._evictable_tokens = 0
        self._protected_tokens = 0

    # -- lookup ---------------------------------------------------------------------------------
    def _child_key(self, tokens: np.ndarray, pos: int) -> bytes:
        return tokens[pos : pos + self.page_size].tobytes()

    def _walk(self, tokens: np.ndarray) -> tuple[_Node, int, list[torch.Tensor]]:
        """Descend as far as `tokens` matches, splitting an edge matched part-way."""
        P, node, pos, now = self.page_size, self.root, 0, next(self._clock)
        limit = len(tokens) // P * P
        values: list[torch.Tensor] = []
        while pos < limit:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            m = _first_mismatch(child.key, tokens[pos:limit]) // P * P
            if m < len(child.key):
                child = self._split(child, m)
            child.last_access = now
            values.append(child.value)
            pos += m
            node = child
            if m < len(child.key):
                break
        return node, pos, values

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut `node`'s edge at `at`; returns the new upper part, which keeps node's locks."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key) and at % self.page_size == 0
        head = _Node(node.key[:at], node.value[:at], parent)
        head.ref, head.last_access = node.ref, node.last_access
        parent.children[self._child_key(node.key, 0)] = head
        node.key, node.value, node.parent = node.key[at:], node.value[at:], head
        head.children[self._child_key(node.key, 0)] = node
        return head

    def match(self, tokens: np.ndarray) -> MatchResult:
        node, length, values = self._walk(check_tokens(tokens))
        locs = torch.cat(values) if values else torch.empty(0, dtype=torch.int64)
        return MatchResult(length, locs, node)

    # -- locking --------------------------------------------------------------------------------
    def _node(self, handle: Any) -> _Node | None:
        if handle is not None and not isinstance(handle, _Node):
            raise TypeError(f"handle must come from match(), got {type(handle).__name__}")
        if handle is not None and handle.parent is None and handle is not self.root:
            raise ValueError(f"radixserve.native: {HANDLE_MESSAGE}")  # evicted since the match
        return handle

    def lock(self, handle: Any) -> None:
        node = self._node(handle)
        while node is not None and node is not self.root:
            if node.ref == 0:
                self._evictable_tokens -= len(node.key)
                self._protected_tokens += len(node.key)
            node.ref += 1
            node = node.parent

    @staticmethod
    def _own_locks(node: _Node) -> int:
        """Locks taken through this node's handle; unlocking an ancestor of the locked node instead
        would leave a child locked more than its parent."""
        return node.ref - sum(c.ref for c in node.children.values())

    def unlock(self, handle: Any) -> None:
        node = self._node(handle)
        if node is not None and node is not self.root and self._own_locks(node) <= 0:
            raise ValueError(f"radixserve.native: {UNLOCK_MESSAGE}")
        while node is not None and node is not self.root:
            node.ref -= 1
            if node.ref == 0:
                self._evictable_tokens += len(node.key)
                self._protected_tokens -= len(node.key)
                if not node.children:
                    self._push(node)
            node = node.parent

    # -- insert / evict -------------------------------------------------------------------------
    def insert(self, tokens: np.ndarray, locations: torch.Tensor) -> int:
        tokens, locs = check_insert(tokens, locations, self.page_size)
        locations = torch.from_numpy(locs)
        node, pos, _ = self._walk(tokens)
        if pos < len(tokens):
            leaf = _Node(tokens[pos:].copy(), locations[pos:].clone(), node)
            leaf.last_access = next(self._clock)
            node.children[self._child_key(leaf.key, 0)] = leaf
            self._evictable_tokens += len(leaf.key)
            self._push(leaf)
        return pos

    def _push(self, node: _Node) -> None:
        heapq.heappush(self._heap, (node.last_access, next(self._tie), node))

    def evict(self, num_pages: int) -> list[int]:
        P, num_pages = self.page_size, check_num_pages(num_pages)
        freed: list[int] = []
        while len(freed) < num_pages and self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if node.parent is None or node.ref > 0 or node.children:
                continue  # no longer an evictable leaf; a later event re-queues it
            if stamp != node.last_access:
                self._push(node)  # touched since queued: re-queue at its new age
                continue
            freed.extend((node.value[::P] // P).tolist())
            self._evictable_tokens -= len(node.key)
            parent = node.parent
            del parent.children[self._child_key(node.key, 0)]
            node.parent = None
            if parent is not self.root and parent.ref == 0 and not parent.children:
                self._push(parent)
        return freed

    # -- accounting -----------------------------------------------------------------------------
    def sizes(self) -> CacheSizes:
        return CacheSizes(
            self._evictable_tokens // self.page_size, self._protected_tokens // self.page_size
        )

    def check_integrity(self) -> None:
        evictable = protected = 0
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            assert len(node.key) == len(node.value) > 0 and len(node.key) % self.page_size == 0
            assert node.ref >= 0 and self._own_locks(node) >= 0, "children locked above parent"
            if node.ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            stack.extend(node.children.values())
        assert (evictable, protected) == (self._evictable_tokens, self._protected_tokens), (
            f"cache sizes drifted: tree has {evictable}/{protected}, "
            f"counters say {self._evictable_tokens}/{self._protected_tokens}"
        )

    def pages(self) -> list[int]:
        """Every page the cache holds (for tests of the pool invariant)."""
        out, stack, P = [], list(self.root.children.values()), self.page_size
        while stack:
            node = stack.pop()
            out.extend((node.value[::P] // P).tolist())
            stack.extend(node.children.values())
        return out
