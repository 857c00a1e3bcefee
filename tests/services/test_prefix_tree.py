"""The gateway's per-replica prefix tree (`services/gateway/routing/prefix_tree.py`): matches agree
with a brute-force reference, the token and node bounds hold, and eviction is least recently used
first."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import pytest
from radixserve.services.gateway.routing.prefix_tree import PrefixTree, as_key, common_len


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _brute_match(stored: Iterable[Sequence[int]], query: Sequence[int]) -> int:
    return max((_lcp(s, query) for s in stored), default=0)


def _prompt(rng: random.Random, bases: list[list[int]], vocab: int = 6) -> list[int]:
    """A prompt that often shares a prefix of random length with an earlier one, over a small
    vocabulary so that edges split at every depth."""
    head: list[int] = []
    if bases and rng.random() < 0.8:
        base = rng.choice(bases)
        head = base[: rng.randint(0, len(base))]
    return head + [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]


@pytest.mark.parametrize("seed", range(8))
def test_match_is_the_longest_common_prefix_with_any_inserted_prompt(seed: int) -> None:
    """With room for everything, match(q) is the longest common prefix of q with any prompt ever
    inserted, and insert reports the part that was already there."""
    rng = random.Random(seed)
    tree, inserted = PrefixTree(max_tokens=10**9), []
    for _ in range(300):
        prompt = _prompt(rng, inserted)
        assert tree.insert(prompt) == _brute_match(inserted, prompt)
        inserted.append(prompt)
        query = _prompt(rng, inserted)
        assert tree.match(query) == _brute_match(inserted, query)
    tree.check_integrity()
    for prompt in inserted:
        assert tree.match(prompt) == len(prompt)


@pytest.mark.parametrize("seed", range(8))
def test_a_bounded_tree_matches_what_it_still_stores_and_never_exceeds_its_bound(seed: int) -> None:
    """Under a long random workload the tree stays within max_tokens after every insert; what it
    stores are prefixes of inserted prompts, and match(q) is the longest common prefix of q with
    them; the latest prompt, when it fits, is always fully stored."""
    rng = random.Random(100 + seed)
    bound = rng.choice([1, 7, 40, 120])
    tree, inserted = PrefixTree(max_tokens=bound), []
    for step in range(600):
        prompt = _prompt(rng, inserted[-20:], vocab=rng.choice([3, 50]))
        tree.insert(prompt)
        inserted.append(prompt)
        assert tree.num_tokens <= bound
        if len(prompt) <= bound:
            assert tree.match(prompt) == len(prompt)
        if step % 25 == 0:
            tree.check_integrity()
            stored = list(tree.paths())
            assert all(any(p == tuple(s[: len(p)]) for s in inserted) for p in stored)
            for query in (_prompt(rng, inserted[-20:]) for _ in range(10)):
                assert tree.match(query) == _brute_match(stored, query)


@pytest.mark.parametrize("seed", range(8))
def test_a_tree_bounded_in_nodes_keeps_the_latest_prompt_whole(seed: int) -> None:
    """With a node bound as small as 1, the tree stays within both bounds after every insert, what
    it stores are prefixes of inserted prompts, insert reports what was already held, and the latest
    prompt that fits the token bound is fully stored, however its path was split before."""
    rng = random.Random(200 + seed)
    max_tokens, max_nodes = rng.choice([30, 10**9]), rng.choice([1, 2, 3, 8])
    tree, inserted = PrefixTree(max_tokens, max_nodes), []
    for step in range(600):
        prompt = _prompt(rng, inserted[-20:], vocab=rng.choice([3, 50]))
        stored = list(tree.paths())
        assert tree.insert(prompt) == _brute_match(stored, prompt[:max_tokens])
        inserted.append(prompt)
        assert tree.num_tokens <= max_tokens and tree.num_nodes <= max_nodes
        assert tree.match(prompt) == min(len(prompt), max_tokens)
        if step % 25 == 0:
            tree.check_integrity()
            assert all(any(p == tuple(s[: len(p)]) for s in inserted) for p in tree.paths())


def test_many_short_distinct_prompts_are_bounded_in_nodes_keeping_the_latest() -> None:
    """Short distinct prompts cost about a node each (some 400 bytes, against 4 a token), so it is
    the node bound that holds their tree's memory; the most recent prompts are still there."""
    rng = random.Random(3)
    tree = PrefixTree(max_tokens=2**17, max_nodes=2**17 // 64)
    prompts = [[rng.randrange(150_000) for _ in range(rng.randint(4, 32))] for _ in range(6000)]
    for i, prompt in enumerate(prompts):
        tree.insert(prompt)
        assert tree.num_nodes <= 2**17 // 64
        if i % 500 == 0:
            tree.check_integrity()
    tree.check_integrity()
    assert tree.num_tokens < 2**17 // 2  # the token bound is far off
    assert all(tree.match(p) == len(p) for p in prompts[-1500:])
    assert not any(tree.match(p) == len(p) for p in prompts[:3000])


def test_long_prompts_are_bounded_by_tokens_as_without_a_node_bound() -> None:
    """Prompts of hundreds of tokens fill the token bound long before the node bound (one node per
    64 tokens of it): the tree evicts exactly what a tree without a node bound would."""
    rng = random.Random(5)
    bounded, plain = PrefixTree(2**14, max_nodes=2**14 // 64), PrefixTree(2**14)
    systems = [[rng.randrange(1000) for _ in range(rng.randint(100, 400))] for _ in range(6)]
    for step in range(500):
        prompt = rng.choice(systems) + [rng.randrange(1000) for _ in range(rng.randint(150, 1500))]
        assert bounded.insert(prompt) == plain.insert(prompt)
        if step % 50 == 0:
            assert sorted(bounded.paths()) == sorted(plain.paths())
            bounded.check_integrity()
    assert bounded.num_tokens > 2**14 - 1500 and bounded.num_nodes < 2**14 // 64
    assert sorted(bounded.paths()) == sorted(plain.paths())


def test_a_one_node_tree_holds_the_latest_prompt_alone() -> None:
    tree = PrefixTree(max_tokens=100, max_nodes=1)
    assert tree.insert([1, 2, 3]) == 0
    assert tree.insert([1, 2, 3, 4, 5]) == 3  # extends the only node
    assert list(tree.paths()) == [(1, 2, 3, 4, 5)]
    assert tree.insert([1, 2, 7]) == 2  # split, then the older branch goes
    assert list(tree.paths()) == [(1, 2, 7)]
    assert tree.insert([1, 2]) == 2  # ends mid-edge: the unused tail goes
    assert list(tree.paths()) == [(1, 2)]
    assert tree.insert([9]) == 0
    assert list(tree.paths()) == [(9,)] and (tree.num_nodes, tree.num_tokens) == (1, 1)
    tree.check_integrity()


def test_eviction_drops_the_least_recently_used_prefix_first() -> None:
    """A prefix used again survives eviction; the prefixes left unused go first, oldest first, and
    of a prompt used again only in part, the unused tail goes before the used head."""
    tree = PrefixTree(max_tokens=40)
    a, b, c, d, e, f = ([k] * n for k, n in ((1, 10), (2, 10), (3, 10), (4, 10), (5, 10), (6, 25)))
    for prompt in (a, b, c, d, a, e):
        tree.insert(prompt)
    assert [tree.match(p) for p in (a, b, c, d, e)] == [10, 0, 10, 10, 10]
    tree.insert(a[:5])
    tree.insert(f)
    assert [tree.match(p) for p in (a, b, c, d, e, f)] == [5, 0, 0, 0, 10, 25]
    assert tree.num_tokens == 40
    tree.check_integrity()


def test_prefixes_sharing_a_head_are_evicted_tail_first() -> None:
    """A shared head (a system prompt) outlives the branches under it: it is used by each of them,
    and only becomes a leaf when all of them are gone."""
    tree = PrefixTree(max_tokens=60)
    system = list(range(100, 130))
    for k in range(8):
        tree.insert(system + [k] * 5)
    assert tree.num_tokens <= 60
    assert tree.match(system + [7] * 5) == 35
    assert tree.match(system) == 30
    assert tree.match(system + [0] * 5) == 30
    tree.check_integrity()


def test_a_prompt_longer_than_the_bound_keeps_its_head() -> None:
    tree = PrefixTree(max_tokens=8)
    tree.insert(list(range(20)))
    assert tree.num_tokens == 8
    assert tree.match(list(range(20))) == 8
    tree.check_integrity()


def test_match_does_not_count_as_a_use() -> None:
    """Only routing a prompt makes it recent; looking it up (each pick does) does not."""
    tree = PrefixTree(max_tokens=20)
    tree.insert([1] * 10)
    tree.insert([2] * 10)
    assert tree.match([1] * 10) == 10
    tree.insert([3] * 10)
    assert (tree.match([1] * 10), tree.match([2] * 10)) == (0, 10)


def test_empty_prompts_store_nothing() -> None:
    tree = PrefixTree(max_tokens=10)
    assert tree.insert([]) == 0 and tree.match([]) == 0
    assert tree.num_tokens == 0 and list(tree.paths()) == []


def test_common_len_finds_the_first_difference_anywhere_in_an_edge() -> None:
    rng = random.Random(7)
    for _ in range(500):
        edge = [rng.randrange(3) for _ in range(rng.randint(1, 40))]
        key = [rng.randrange(2)] * rng.randint(0, 5) + edge[: rng.randint(1, len(edge))]
        key += [rng.randrange(3) for _ in range(rng.randint(0, 10))]
        pos = key.index(edge[0])  # the edge is reached where its first token is
        assert common_len(as_key(edge), as_key(key), pos) == _lcp(edge, key[pos:])


def test_the_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tokens=0"):
        PrefixTree(max_tokens=0)
    with pytest.raises(ValueError, match="max_nodes=0"):
        PrefixTree(max_tokens=10, max_nodes=0)
