"""The gateway's links (`services/gateway/links.py`): what picking a replica leaves behind."""

from __future__ import annotations

import random

import pytest
from radixserve.services.gateway.links import BackendAddresses, Links
from radixserve.services.gateway.routing import CacheAwareRouter


def _links(schedulers: int) -> Links:
    """Links to `schedulers` replicas that all count as serving, without connecting anything."""
    links = Links(BackendAddresses("unix:/t.sock", [f"unix:/s{i}.sock" for i in range(schedulers)],
                                   "unix:/d.sock"), lambda ready: None)
    for subscription in links.subscriptions:
        subscription.connected = True
    for replica in links.replicas:
        replica.connected = replica.health_serving = True
    return links


def test_one_replica_teaches_the_router_nothing() -> None:
    """Its router is never asked, so the prompts sent there must not pile up in its tree: a soak
    of short random prompts grew the gateway by the tree's ~480 bytes a request."""
    links, rng = _links(1), random.Random(0)
    for _ in range(1000):
        prompt = [rng.randrange(1, 1024) for _ in range(rng.randint(4, 32))]
        assert links.pick(prompt, 1) is links.replicas[0]
    router = links.router
    assert isinstance(router, CacheAwareRouter)
    assert router.tree_tokens(links.replicas[0].address) == 0


@pytest.mark.parametrize("serving", [2, 1])
def test_several_replicas_teach_the_router_their_prompts(serving: int) -> None:
    """Affinity still learns, even while only one of them is serving (the other comes back)."""
    links = _links(2)
    links.replicas[1].connected = serving == 2
    replica = links.pick(list(range(100)), 1)
    router = links.router
    assert isinstance(router, CacheAwareRouter)
    assert router.tree_tokens(replica.address) == 100
