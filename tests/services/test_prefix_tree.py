"""The gateway's per-replica prefix tree (`services/gateway/routing/prefix_tree.py`): matches agree
with a brute-force reference, the token bound holds, and eviction is least recently used first."""

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


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tokens=0"):
        PrefixTree(max_tokens=0)
