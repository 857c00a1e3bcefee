"""Routing over scheduler replicas (`services/gateway/routing/`): cache affinity, load balance,
forgetting replicas that leave, the simple policies, and the policy registry."""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Sequence

import pytest
from radixserve.services.gateway.routing import (
    ROUTERS,
    ROUTING_POLICIES,
    CacheAwareRouter,
    ReplicaLoad,
    Router,
    RoutingConfig,
    check_policy,
    create_router,
)

NAMES = ("10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001", "10.0.0.4:7001")


def _loads(**by_index: int) -> list[ReplicaLoad]:
    """The four replicas of NAMES; `r2=30` gives the third a load of 30, the rest have 0."""
    return [ReplicaLoad(name, by_index.get(f"r{i}", 0)) for i, name in enumerate(NAMES)]


def _system(group: int, length: int = 200) -> list[int]:
    return [1000 * (group + 1) + i for i in range(length)]


def _request(group: int, rng: random.Random) -> list[int]:
    """A request of `group`: its shared 200-token system prompt and a 50-token question."""
    return _system(group) + [rng.randrange(50_000, 60_000) for _ in range(50)]


def _route(router: Router, prompt: Sequence[int], replicas: Sequence[ReplicaLoad]) -> str:
    name = router.pick(prompt, replicas)
    assert name in {r.name for r in replicas}
    router.routed(name, prompt)
    return name


def test_requests_sharing_a_prefix_stick_to_one_replica_and_prefixes_spread() -> None:
    """Each of 8 system prompts gets a home replica that serves all its requests, and every replica
    is home to some, while live loads stay balanced."""
    router, rng = create_router(RoutingConfig()), random.Random(0)
    load = dict.fromkeys(NAMES, 0)
    in_flight: deque[str] = deque()
    homes: dict[int, set[str]] = {g: set() for g in range(8)}
    for _ in range(400):
        group = rng.randrange(8)
        name = _route(router, _request(group, rng), [ReplicaLoad(n, load[n]) for n in NAMES])
        homes[group].add(name)
        load[name] += 1
        in_flight.append(name)
        if len(in_flight) > 6:  # a request finishes after six more have arrived
            load[in_flight.popleft()] -= 1
    assert all(len(h) == 1 for h in homes.values()), homes
    assert {next(iter(h)) for h in homes.values()} == set(NAMES)


def test_new_prefixes_go_to_the_emptiest_cache_when_loads_are_equal() -> None:
    router, rng = create_router(RoutingConfig()), random.Random(5)
    homes = [_route(router, _request(group, rng), _loads()) for group in range(8)]
    assert Counter(homes) == dict.fromkeys(NAMES, 2)
    assert [router.pick(_request(g, rng), _loads()) for g in range(8)] == homes


def test_an_imbalanced_load_overrides_affinity() -> None:
    """The home replica of a prefix keeps it under a small or proportionally small load gap, and
    loses it to the least-loaded replica when its load is both 32 over and 1.5x the least."""
    router, rng = create_router(RoutingConfig()), random.Random(1)
    home = _route(router, _request(0, rng), _loads())
    assert home == NAMES[0]
    for busy, others, expected in [
        (60, 45, NAMES[0]),  # 15 more: balanced
        (200, 150, NAMES[0]),  # 50 more, but only 1.33x
        (60, 20, NAMES[1]),  # 40 more and 3x: imbalanced
        (33, 0, NAMES[1]),  # 33 more than an idle replica
    ]:
        replicas = [ReplicaLoad(NAMES[0], busy)] + [
            ReplicaLoad(n, others + (i > 0)) for i, n in enumerate(NAMES[1:])
        ]
        assert router.pick(_request(0, rng), replicas) == expected, (busy, others)


def test_a_forgotten_replica_is_never_picked_for_its_old_prefixes() -> None:
    """After forget, the replica that held a prefix wins it only as any empty replica would; the
    replica the prefix moves to keeps it, even once the first one serves again."""
    router, rng = create_router(RoutingConfig()), random.Random(2)
    for group in range(4):
        _route(router, _request(group, rng), _loads())
    assert router.pick(_request(0, rng), _loads(r0=5)) == NAMES[0]  # affinity beats load 5
    router.forget(NAMES[0])
    assert isinstance(router, CacheAwareRouter) and router.tree_tokens(NAMES[0]) == 0
    new_home = _route(router, _request(0, rng), _loads(r0=5, r2=1, r3=1))
    assert new_home == NAMES[1]
    for _ in range(5):
        assert router.pick(_request(0, rng), _loads(r1=4)) == NAMES[1]


def test_a_replica_that_stopped_serving_is_never_picked() -> None:
    router, rng = create_router(RoutingConfig()), random.Random(3)
    home = _route(router, _request(0, rng), _loads())
    serving = [r for r in _loads() if r.name != home]
    for _ in range(10):
        assert router.pick(_request(0, rng), serving) != home


def test_affinity_needs_cache_threshold_of_the_prompt() -> None:
    """A replica holding under `cache_threshold` of the prompt does not win it over an emptier,
    equally loaded one; ties in the matched length go to the lower load."""
    router = create_router(RoutingConfig(cache_threshold=0.5))
    replicas = [ReplicaLoad(NAMES[0], 0), ReplicaLoad(NAMES[1], 0)]
    assert _route(router, list(range(100)), replicas) == NAMES[0]
    assert router.pick(list(range(49)) + [-1] * 51, replicas) == NAMES[1]  # 49% cached
    assert router.pick(list(range(50)) + [-1] * 50, replicas) == NAMES[0]  # 50% cached
    router.routed(NAMES[1], list(range(100)))
    for load_0, load_1, expected in [(3, 2, NAMES[1]), (2, 3, NAMES[0]), (2, 3, NAMES[0])]:
        replicas = [ReplicaLoad(NAMES[0], load_0), ReplicaLoad(NAMES[1], load_1)]
        assert router.pick(list(range(100)), replicas) == expected


def test_without_affinity_the_least_loaded_then_emptiest_replica_wins() -> None:
    router = create_router(RoutingConfig())
    router.routed(NAMES[0], list(range(500)))
    router.routed(NAMES[1], list(range(1000, 1100)))
    assert router.pick([7, 7, 7], _loads(r2=1, r3=1)) == NAMES[1]  # fewer cached tokens
    assert router.pick([7, 7, 7], _loads(r0=2, r1=2, r2=1)) == NAMES[3]
    assert router.pick([], _loads(r0=1, r1=1, r3=1)) == NAMES[2]  # an empty prompt


def test_the_cache_aware_trees_stay_within_their_bound() -> None:
    router, rng = create_router(RoutingConfig(max_tree_tokens=5000)), random.Random(4)
    assert isinstance(router, CacheAwareRouter)
    for _ in range(500):
        group = rng.randrange(40)
        replicas = [ReplicaLoad(n, rng.randrange(8)) for n in NAMES if rng.random() < 0.9]
        _route(router, _request(group, rng), replicas or _loads())
        assert all(router.tree_tokens(n) <= 5000 for n in NAMES)


def test_the_cache_aware_trees_are_bounded_in_nodes_too() -> None:
    """Short distinct prompts (about a node each, some 400 bytes) fill a tree's node bound, one node
    per 64 tokens of max_tree_tokens and at least 1,024, long before its token bound: the replica's
    tree forgets the oldest of them, which lose their affinity, and keeps the latest."""
    assert RoutingConfig().max_tree_nodes == 2**15
    assert RoutingConfig(max_tree_tokens=5000).max_tree_nodes == 1024
    router = create_router(RoutingConfig(max_tree_tokens=2**17))
    prompts = [[10 * i + k for k in range(4)] for i in range(5000)]
    for prompt in prompts:
        router.routed(NAMES[0], prompt)
    assert router.tree_tokens(NAMES[0]) == 4 * 2**11
    assert router.pick(prompts[-1], _loads()) == NAMES[0]
    assert router.pick(prompts[0], _loads()) != NAMES[0]  # forgotten: the emptiest tree wins


def test_round_robin_cycles_whatever_the_list_order() -> None:
    router = create_router(RoutingConfig(policy="round_robin"))
    replicas = _loads(r0=50)
    picks = [router.pick([1], order) for order in
             (replicas, replicas[::-1], replicas[1:] + replicas[:1]) * 4]
    assert picks == list(NAMES) * 3
    # A replica leaving mid-cycle is skipped; the cycle goes on from where it was.
    assert router.pick([1], _loads()) == NAMES[0]
    assert [router.pick([1], [r for r in _loads() if r.name != NAMES[1]]) for _ in range(3)] \
        == [NAMES[2], NAMES[3], NAMES[0]]


def test_least_load_picks_the_minimum_and_spreads_ties() -> None:
    router = create_router(RoutingConfig(policy="least_load"))
    router.routed(NAMES[0], [1, 2, 3])  # prompts do not matter to it
    assert router.pick([1, 2, 3], _loads(r0=3, r1=1, r2=2, r3=4)) == NAMES[1]
    assert router.pick([1], _loads(r0=3, r1=9, r2=3, r3=3)) in NAMES[0::2] + NAMES[3:]
    assert sorted(router.pick([1], _loads()) for _ in range(8)) == sorted(NAMES * 2)


def test_policies_are_chosen_by_name() -> None:
    assert set(ROUTERS) == set(ROUTING_POLICIES) == {"cache_aware", "least_load", "round_robin"}
    for policy in ROUTING_POLICIES:
        router = create_router(RoutingConfig(policy=policy))  # type: ignore[arg-type]
        assert router.policy == policy and isinstance(router, ROUTERS[policy])
    assert RoutingConfig().policy == "cache_aware"


@pytest.mark.parametrize("make", [lambda: RoutingConfig(policy="random"),  # type: ignore[arg-type]
                                  lambda: check_policy("cache-aware")])
def test_an_unknown_policy_name_lists_the_valid_ones(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="cache_aware, least_load, round_robin"):
        make()


@pytest.mark.parametrize("options, words", [
    ({"cache_threshold": 1.5}, "cache_threshold .* in \\[0, 1\\], got 1.5"),
    ({"cache_threshold": float("nan")}, "cache_threshold"),
    ({"balance_abs": -1}, "balance_abs .* >= 0, got -1"),
    ({"balance_abs": 2.5}, "balance_abs .* integer"),
    ({"balance_rel": 0.5}, "balance_rel .* >= 1.0"),
    ({"max_tree_tokens": 0}, "max_tree_tokens .* >= 1, got 0"),
])
def test_bad_options_say_what_is_wrong(options: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        RoutingConfig(**options)


@pytest.mark.parametrize("policy", ROUTING_POLICIES)
def test_pick_needs_distinct_serving_replicas(policy: str) -> None:
    router = create_router(RoutingConfig(policy=policy))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one serving replica"):
        router.pick([1], [])
    with pytest.raises(ValueError, match="repeat"):
        router.pick([1], [ReplicaLoad("a", 0), ReplicaLoad("a", 1)])
    router.forget("never-seen")  # a replica the router never heard of is no error
