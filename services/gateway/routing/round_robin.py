"""Round robin: each replica in turn, whatever the prompt or the loads."""

from __future__ import annotations

from collections.abc import Sequence

from radixserve.services.gateway.routing.base import ReplicaLoad, Router
from radixserve.services.gateway.routing.config import RoutingConfig


class Rotation:
    """Cycles through names in sorted order: the next pick is the first name after the last one,
    wrapping around. The order does not depend on the caller's list order, and a replica that
    joins or leaves shifts the cycle without restarting it."""

    def __init__(self) -> None:
        self._last: str | None = None

    def next(self, names: Sequence[str]) -> str:
        last = self._last
        later = [n for n in names if last is not None and n > last]
        self._last = min(later) if later else min(names)
        return self._last


class RoundRobinRouter(Router):
    policy = "round_robin"

    def __init__(self, config: RoutingConfig) -> None:
        super().__init__(config)
        self._rotation = Rotation()

    def _select(self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> str:
        return self._rotation.next([r.name for r in replicas])
