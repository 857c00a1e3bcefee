"""Cache-aware routing: send a prompt where its prefix is probably cached, unless loads diverge.

In the spirit of SGLang's cache-aware router. While loads are balanced (see `RoutingConfig`), the
replica whose prefix tree holds the longest prefix of the prompt wins, if that prefix covers at
least `cache_threshold` of the prompt; ties go to the lower load. Otherwise, and whenever loads
are imbalanced, the least-loaded replica wins, ties to the one whose tree holds the fewest tokens
(the most room in its cache, and the fewest prefixes this prompt would push out), then in turn.
Requests with a common prefix so stick to one replica, and new prefixes spread over all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixserve.services.gateway.routing.base import ReplicaLoad, Router
from radixserve.services.gateway.routing.config import RoutingConfig
from radixserve.services.gateway.routing.least_load import least
from radixserve.services.gateway.routing.prefix_tree import PrefixTree, as_key
from radixserve.services.gateway.routing.round_robin import Rotation


class CacheAwareRouter(Router):
    policy = "cache_aware"

    def __init__(self, config: RoutingConfig) -> None:
        super().__init__(config)
        self._trees: dict[str, PrefixTree] = {}
        self._rotation = Rotation()

    def tree_tokens(self, name: str) -> int:
        """Tokens the router believes replica `name` has cached."""
        tree = self._trees.get(name)
        return tree.num_tokens if tree is not None else 0

    def imbalanced(self, replicas: Sequence[ReplicaLoad]) -> bool:
        high = max(r.load for r in replicas)
        low = min(r.load for r in replicas)
        return high - low > self.config.balance_abs and high > self.config.balance_rel * low

    def _select(self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> str:
        if prompt_ids and not self.imbalanced(replicas):
            key = as_key(prompt_ids)  # converted once for all trees
            matched = {r.name: self._match(r.name, key) for r in replicas}
            longest = max(matched.values())
            if longest > 0 and longest >= self.config.cache_threshold * len(key):
                return least(replicas, lambda r: (-matched[r.name], r.load), self._rotation)
        return least(replicas, lambda r: (r.load, self.tree_tokens(r.name)), self._rotation)

    def _match(self, name: str, key: Sequence[int]) -> int:
        tree = self._trees.get(name)
        return tree.match(key) if tree is not None else 0

    def routed(self, name: str, prompt_ids: Sequence[int]) -> None:
        tree = self._trees.get(name)
        if tree is None:
            config = self.config
            tree = self._trees[name] = PrefixTree(config.max_tree_tokens, config.max_tree_nodes)
        tree.insert(prompt_ids)

    def forget(self, name: str) -> None:
        self._trees.pop(name, None)
