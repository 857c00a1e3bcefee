"""bench serving's request lists: the shared-prefix workload's groups, what they share, its
shuffle; the random workload as it always was (the same seed, the same requests)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from radixserve.bench.workloads import (
    SharedPrefix,
    random_work,
    shared_prefix_work,
    warm_up_prompts,
)

SPEC = SharedPrefix(groups=3, per_group=3, prefix_len=48, suffix_len=4)


def test_shared_prefix_groups_share_their_prefix_and_nothing_else() -> None:
    work = shared_prefix_work(SPEC, output_len=4, vocab=1024, seed=7)
    assert len(work) == SPEC.num_requests == 9
    assert all(len(prompt) == 52 and max_new == 4 for prompt, max_new in work)
    assert all(0 < t < 1024 for prompt, _ in work for t in prompt)
    groups = Counter(tuple(prompt[:48]) for prompt, _ in work)
    assert sorted(groups.values()) == [3, 3, 3]  # three distinct prefixes, three requests each
    # Within a group every suffix is its own, so a request shares exactly the prefix with the rest.
    assert len({tuple(prompt[48:]) for prompt, _ in work}) == 9


def test_shared_prefix_shuffle_follows_the_seed() -> None:
    spec = SharedPrefix(groups=8, per_group=4, prefix_len=16, suffix_len=2)
    first = shared_prefix_work(spec, 4, 1024, seed=3)
    assert shared_prefix_work(spec, 4, 1024, seed=3) == first
    assert shared_prefix_work(spec, 4, 1024, seed=4) != first
    # Shuffled: the sending order is not group after group (8 groups of 4 in a row would be).
    order = [tuple(p[:16]) for p, _ in first]
    runs = 1 + sum(a != b for a, b in zip(order, order[1:]))
    assert runs > 8


def test_shared_prefix_refuses_sizes_it_cannot_make() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        SharedPrefix(groups=0)
    with pytest.raises(ValueError, match="distinct suffixes"):  # 3 ids below 4, 5 suffixes of one
        shared_prefix_work(SharedPrefix(1, 5, 8, 1), 4, vocab=4, seed=0)


def test_random_work_is_the_serving_workload_of_before() -> None:
    """The random workload draws what `bench serving` drew before the workloads moved out, so its
    recorded figures stay comparable."""
    rng = random.Random(5)
    length = lambda n: rng.randint(max(1, int(n * 0.5)), n)  # noqa: E731
    before = [([rng.randrange(1, 1000) for _ in range(length(32))], length(8)) for _ in range(6)]
    assert random_work(6, 32, 8, 0.5, vocab=1000, seed=5) == before


def test_warm_up_prompts_are_no_workload_prompts() -> None:
    work = shared_prefix_work(SPEC, 4, 1024, seed=0)
    warm = warm_up_prompts(2, 52, 1024, seed=0)
    assert len(warm) == 2 and all(len(p) == 52 for p in warm)
    prefixes = {tuple(p[:48]) for p, _ in work}
    assert not any(tuple(p[:48]) in prefixes for p in warm)


def test_each_serving_level_sends_prompts_of_its_own() -> None:
    """A later level's prompts are not an earlier level's, which the prefix cache would serve
    (a rate level after a concurrency level measured almost no prefill that way); level 0 is the
    offline baseline's."""
    from radixserve.bench.serving import BenchConfig, _workload

    cfg = BenchConfig("unused:0", (4,), num_prompts=8, input_len=32, output_len=4,
                      range_ratio=0.5, request_rate=float("inf"), temperature=0.0, seed=3)
    levels = [_workload(cfg, vocab=1000, level=i) for i in range(3)]
    assert levels[0] == _workload(cfg, vocab=1000) == random_work(8, 32, 4, 0.5, 1000, seed=3)
    prompts = [{tuple(p) for p, _ in work} for work in levels]
    assert not (prompts[0] & prompts[1] or prompts[0] & prompts[2] or prompts[1] & prompts[2])
