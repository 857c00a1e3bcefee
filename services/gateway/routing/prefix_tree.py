"""An approximate radix tree of the prompts sent to one replica, bounded in tokens and in nodes,
LRU-evicted.

The gateway cannot see a replica's KV prefix cache, so it keeps its own guess: the prompts it routed
there, forgetting the least recently used ones once the tree holds more than `max_tokens` tokens or
more than `max_nodes` nodes. The guess ignores page alignment, generated tokens and the replica's
own evictions; it only has to rank replicas by how much of a prompt they probably hold. The token
bound mirrors the replica's KV pool; the node bound caps the tree's memory, which is about 400 bytes
a node besides 4 bytes a token, so short distinct prompts (about a node each) would otherwise cost
far more than their tokens (`RoutingConfig`).

One tree per replica rather than one shared tree with per-node owners: at 4 bytes a token, a
prefix stored once per replica costs little (8 KiB a replica for a 2k-token system prompt), where a
shared tree needs a map of owners and their last uses on every node; each tree is a plain leaf-LRU
with its own bound; and a replica that leaves is forgotten by dropping its tree. A pick walks every
serving replica's tree, and for a handful of replicas the walks together cost less than turning the
prompt into an array once (docs/benchmarks.md, "Routing picks").

Edges are `array("i")` runs of token ids, children keyed by their edge's first token. Comparing two
arrays of one typecode is a C loop, so a walk costs one slice comparison per node, plus a binary
search of slice comparisons on the edge where the prompt leaves the tree. Leaves wait in a heap
ordered by last use; stale entries are skipped or re-queued when popped, so eviction never scans.
"""

from __future__ import annotations

import heapq
import itertools
import struct
from array import array
from collections.abc import Iterator, Sequence

TokenKey = array  # array("i") of token ids: token ids are int32 vocabulary indices


def as_key(ids: Sequence[int]) -> TokenKey:
    """`ids` as the tree's key type; an `array("i")` passes through uncopied, so a caller that
    matches one prompt against several trees converts it once."""
    if isinstance(ids, array) and ids.typecode == "i":
        return ids
    # struct packs a list of ints about twice as fast as array("i", ...) converts one.
    return array("i", struct.pack(f"{len(ids)}i", *ids))


def common_len(edge: TokenKey, key: TokenKey, pos: int) -> int:
    """Length of the common prefix of `edge` and `key[pos:]`, given `edge[0] == key[pos]`."""
    n = len(edge)
    if key[pos : pos + n] == edge:
        return n
    lo, hi = 1, min(n, len(key) - pos)  # edge[:lo] matches; the answer lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if edge[lo:mid] == key[pos + lo : pos + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Node:
    __slots__ = ("key", "parent", "children", "stamp")

    def __init__(self, key: TokenKey, parent: _Node | None, stamp: int) -> None:
        self.key = key
        self.parent = parent  # None once evicted or merged away (and for the root)
        self.children: dict[int, _Node] = {}  # keyed by the child's first token
        self.stamp = stamp  # the last insert that reached this node


class PrefixTree:
    """Token-id prefixes routed to one replica. Not locked: one thread (the gateway's event loop)
    owns it."""

    def __init__(self, max_tokens: int, max_nodes: int | None = None) -> None:
        """`max_nodes=None`: bounded by tokens alone (a node holds at least one token)."""
        if max_tokens < 1:
            raise ValueError(f"a prefix tree holds at least 1 token, got max_tokens={max_tokens}")
        if max_nodes is not None and max_nodes < 1:
            raise ValueError(f"a prefix tree holds at least 1 node, got max_nodes={max_nodes}")
        self.max_tokens = max_tokens
        self.max_nodes = max_tokens if max_nodes is None else max_nodes
        self.num_tokens = 0  # sum of edge lengths, <= max_tokens after every insert
        self.num_nodes = 0  # without the root; <= max_nodes after every insert
        self._root = _Node(array("i"), None, 0)
        self._clock = itertools.count(1)
        self._heap: list[tuple[int, int, _Node]] = []  # (stamp when pushed, tie, leaf)
        self._tie = itertools.count()

    def match(self, ids: Sequence[int]) -> int:
        """How many leading tokens of `ids` the tree holds. Read-only: does not count as a use."""
        key, node, pos = as_key(ids), self._root, 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                return pos
            edge = child.key
            end = pos + len(edge)
            # A one-token edge matched with its dict key; deep trees are mostly such edges.
            if len(edge) > 1 and key[pos:end] != edge:
                return pos + common_len(edge, key, pos)
            node, pos = child, end
        return pos

    def insert(self, ids: Sequence[int]) -> int:
        """Add `ids` as used now, then evict least recently used leaves while over `max_tokens` or
        `max_nodes`. Returns how many leading tokens were already held."""
        # A prompt longer than the bound keeps its head: that is the part later prompts share.
        key, node, pos = as_key(ids)[: self.max_tokens], self._root, 0
        stamp = next(self._clock)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = _Node(key[pos:], node, stamp)
                node.children[key[pos]] = leaf
                self.num_tokens += len(leaf.key)
                self.num_nodes += 1
                self._push(leaf)
                self._merge_path(node)
                break
            edge = child.key
            if len(edge) > 1 and key[pos : pos + len(edge)] != edge:
                # The prompt ends or leaves the tree mid-edge.
                child = self._split(child, common_len(edge, key, pos))
            child.stamp = stamp
            pos += len(child.key)
            self._merge_path(node)
            node = child
        self._evict()
        return pos

    def paths(self) -> Iterator[tuple[int, ...]]:
        """Every root-to-leaf token sequence the tree holds."""
        stack: list[tuple[_Node, tuple[int, ...]]] = [(self._root, ())]
        while stack:
            node, prefix = stack.pop()
            prefix += tuple(node.key)
            if not node.children and node is not self._root:
                yield prefix
            stack.extend((child, prefix) for child in node.children.values())

    def check_integrity(self) -> None:
        """Assert the tree's invariants; O(size), for tests."""
        num_tokens = num_nodes = 0
        leaves = {id(n) for _, _, n in self._heap if n.parent is not None and not n.children}
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            num_tokens, num_nodes = num_tokens + len(node.key), num_nodes + 1
            assert node.key, "an edge holds at least one token"
            assert node.parent is not None and node.parent.children[node.key[0]] is node
            assert node.stamp <= node.parent.stamp or node.parent is self._root, "use runs rootward"
            assert node.children or id(node) in leaves, "every leaf waits in the eviction heap"
            stack.extend(node.children.values())
            if len(node.children) == 1:
                (child,) = node.children.values()
                assert child.stamp != node.stamp, "a node and its only child last used together"
        assert (num_tokens, num_nodes) == (self.num_tokens, self.num_nodes), "stale counters"
        assert self.num_tokens <= self.max_tokens, "over the token bound"
        assert self.num_nodes <= self.max_nodes, "over the node bound"

    # -- structure --------------------------------------------------------------------------------
    def _split(self, node: _Node, at: int) -> _Node:
        """Cut `node`'s edge after `at` tokens; returns the new upper part. `node` stays the lower
        part, so its heap entries stay valid."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        head = _Node(node.key[:at], parent, node.stamp)
        parent.children[node.key[0]] = head
        node.key, node.parent = node.key[at:], head
        head.children[node.key[0]] = node
        self.num_nodes += 1
        return head

    def _merge_path(self, node: _Node) -> None:
        """Merge `node`, reached by the insert under way, into its child if that is its only one
        (which the insert reached too, so both carry its stamp). This keeps the path just inserted
        to one node per branching, so that evicting everything older leaves it whole in a single
        node, within any bound (`_evict`); and it spares a node."""
        if len(node.children) == 1 and node is not self._root:
            self._merge_into_child(node)

    def _merge_into_child(self, node: _Node) -> None:
        """Fold a node with one child into that child, when both were last used by the same
        insert: evicting them together is then what LRU would do one after the other."""
        (child,) = node.children.values()
        parent = node.parent
        assert parent is not None and child.stamp == node.stamp
        child.key = node.key + child.key
        child.parent = parent
        parent.children[child.key[0]] = child
        node.parent, node.children = None, {}
        self.num_nodes -= 1

    # -- eviction ---------------------------------------------------------------------------------
    def _push(self, leaf: _Node) -> None:
        heapq.heappush(self._heap, (leaf.stamp, next(self._tie), leaf))
        if len(self._heap) > 2 * self.num_nodes + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop heap entries of nodes that are gone or no longer leaves, keeping one per live leaf.
        Stale entries carry old stamps, so the next eviction usually pops them first; this bounds
        the heap whatever the workload."""
        live = {id(n): n for _, _, n in self._heap if n.parent is not None and not n.children}
        self._heap = [(n.stamp, next(self._tie), n) for n in live.values()]
        heapq.heapify(self._heap)

    def _evict(self) -> None:
        """Remove least recently used leaves until within both bounds. Every node the last insert
        reached has its stamp, later than any other; so leaves of older inserts all go first, and
        each path node left with only its path child merges into it (`_remove_leaf`, and `insert`
        for those that had one child already). Once they are gone the tree is that path as one
        node of at most `max_tokens` tokens: the loop stops without touching the latest prompt."""
        while self.num_tokens > self.max_tokens or self.num_nodes > self.max_nodes:
            stamp, _, node = heapq.heappop(self._heap)
            if node.parent is None or node.children:
                continue  # gone, or grew children since it was pushed
            if stamp != node.stamp:
                heapq.heappush(self._heap, (node.stamp, next(self._tie), node))  # used since
                continue
            self._remove_leaf(node)

    def _remove_leaf(self, leaf: _Node) -> None:
        parent = leaf.parent
        assert parent is not None and not leaf.children
        del parent.children[leaf.key[0]]
        leaf.parent = None
        self.num_tokens -= len(leaf.key)
        self.num_nodes -= 1
        if parent is self._root:
            return
        if not parent.children:
            self._push(parent)
        elif len(parent.children) == 1:
            (sibling,) = parent.children.values()
            if sibling.stamp == parent.stamp:
                self._merge_into_child(parent)
