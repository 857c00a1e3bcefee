"""The router interface: which scheduler replica gets a request.

The gateway calls `pick` with the serving replicas and their loads, sends the request to the replica
it names, reports that with `routed`, and calls `forget` when a replica stops serving. Routers are
not locked: one thread (the gateway's event loop) owns each.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from radixserve.services.gateway.routing.config import RoutingConfig, RoutingPolicy


@dataclass(frozen=True)
class ReplicaLoad:
    name: str  # the scheduler address the gateway dials
    load: int  # running + waiting requests, as the gateway best knows


class Router(ABC):
    policy: ClassVar[RoutingPolicy]

    def __init__(self, config: RoutingConfig) -> None:
        self.config = config

    def pick(self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> str:
        """The name of the replica to send a request for `prompt_ids` to, one of `replicas` (the
        serving ones: at least one, names distinct). Changes only rotation state; what the
        router learns about caches comes from `routed`."""
        if not replicas:
            raise ValueError("pick needs at least one serving replica")
        if len({r.name for r in replicas}) != len(replicas):
            raise ValueError(f"replica names repeat: {[r.name for r in replicas]}")
        return self._select(prompt_ids, replicas)

    @abstractmethod
    def _select(self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> str:
        """`pick` on checked arguments."""

    def routed(self, name: str, prompt_ids: Sequence[int]) -> None:
        """A request for `prompt_ids` was sent to replica `name` (once per request, even one that
        makes several completions): a cache-aware router now expects its prefix cache to hold the
        prompt."""

    def forget(self, name: str) -> None:
        """Replica `name` stopped serving (died, drained, restarted): drop what is known of its
        cache, so it wins no prompt by affinity until `routed` teaches it new ones. Unknown names
        are ignored."""
