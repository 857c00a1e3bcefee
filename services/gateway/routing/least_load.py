"""Least load: the replica with the fewest running + waiting requests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixserve.services.gateway.routing.base import ReplicaLoad, Router
from radixserve.services.gateway.routing.config import RoutingConfig
from radixserve.services.gateway.routing.round_robin import Rotation


def least(replicas: Sequence[ReplicaLoad], key: Callable[[ReplicaLoad], tuple[int, ...]],
          rotation: Rotation) -> str:
    """The replica with the smallest `key`; ties go round in `rotation`, so replicas with equal
    loads (a burst read from one stale load report) share the burst instead of one taking it."""
    keys = [key(r) for r in replicas]
    best = min(keys)
    return rotation.next([r.name for r, k in zip(replicas, keys) if k == best])


class LeastLoadRouter(Router):
    policy = "least_load"

    def __init__(self, config: RoutingConfig) -> None:
        super().__init__(config)
        self._rotation = Rotation()

    def _select(self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> str:
        return least(replicas, lambda r: (r.load,), self._rotation)
