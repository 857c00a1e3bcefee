"""Request routing over data-parallel scheduler replicas, chosen by name (`RoutingConfig.policy`).

Pure domain logic: no protobuf, grpc or asyncio. The gateway builds one router with
`create_router`, and for each request calls `pick`, then `routed`; `forget` when a replica stops
serving.
"""

from __future__ import annotations

from radixserve.services.gateway.routing.base import ReplicaLoad, Router
from radixserve.services.gateway.routing.cache_aware import CacheAwareRouter
from radixserve.services.gateway.routing.config import (
    ROUTING_POLICIES,
    RoutingConfig,
    RoutingPolicy,
    check_policy,
)
from radixserve.services.gateway.routing.least_load import LeastLoadRouter
from radixserve.services.gateway.routing.round_robin import RoundRobinRouter

ROUTERS: dict[str, type[Router]] = {
    cls.policy: cls for cls in (CacheAwareRouter, LeastLoadRouter, RoundRobinRouter)
}
assert set(ROUTERS) == set(ROUTING_POLICIES), "every routing policy has exactly one router"


def create_router(config: RoutingConfig) -> Router:
    return ROUTERS[check_policy(config.policy)](config)


__all__ = [
    "ROUTERS",
    "ROUTING_POLICIES",
    "CacheAwareRouter",
    "LeastLoadRouter",
    "ReplicaLoad",
    "RoundRobinRouter",
    "Router",
    "RoutingConfig",
    "RoutingPolicy",
    "check_policy",
    "create_router",
]
