"""How the gateway spreads requests over its scheduler replicas: the policy and its few knobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

RoutingPolicy = Literal["cache_aware", "least_load", "round_robin"]
ROUTING_POLICIES: tuple[str, ...] = get_args(RoutingPolicy)


def check_policy(name: str) -> RoutingPolicy:
    """`name` if it is a routing policy; a ValueError listing the policies otherwise."""
    if name not in ROUTING_POLICIES:
        raise ValueError(
            f"unknown routing policy {name!r}; choose one of {', '.join(ROUTING_POLICIES)}"
        )
    return name  # type: ignore[return-value]


@dataclass(frozen=True)
class RoutingConfig:
    """Routing options. The cache-aware knobs are ignored by the other policies.

    Loads are a replica's running + waiting requests. They count as imbalanced when the busiest
    replica has more than `balance_abs` requests over the idlest AND more than `balance_rel` times
    its load; both must hold, so a gap of a few requests between idle replicas, or a proportionally
    small gap between busy ones, does not break prefix affinity (a replica batches tens of requests
    per step, so 32 waiting is about one step's worth of delay). While balanced, the replica holding
    the longest prefix of the prompt wins if that prefix is at least `cache_threshold` of the
    prompt: at 0.5, reusing half a prompt's KV saves more prefill than a lighter replica would.
    `max_tree_tokens` bounds the gateway's guess of each replica's cache: 2**21 tokens is the order
    of a large GPU's KV pool (an H200 holds about 1M tokens of an 8B model's KV). Remembering more
    than the replica holds costs misplaced affinity for prefixes it has evicted; remembering less
    loses affinity it still has. The tree's memory is 4 bytes a token plus about 400 bytes a node
    (about one node per distinct prompt): a full tree takes 8-13 MiB a replica for prompts of
    250-2,048 tokens, but short distinct prompts would take far more (measured: 65 MiB full with
    prompts of 4-32 random tokens; 100 MiB after 200k prompts of 4, a third full). So the tree
    is also bounded in nodes, `max_tree_nodes`, one per 64 tokens of `max_tree_tokens`: 32,768
    nodes at the default, about 13 MiB (16 MiB with the tokens of 4-32-token prompts). That never
    binds for prompts averaging 64 tokens or more a node, and of shorter ones it keeps the latest
    30k or so, the ones the replica most probably still holds. It is at least 1,024 nodes (400 KiB,
    too little to matter), so a small tree is bounded by its tokens alone. No flag of its own: it
    follows `max_tree_tokens`.
    """

    policy: RoutingPolicy = "cache_aware"
    cache_threshold: float = 0.5
    balance_abs: int = 32
    balance_rel: float = 1.5
    max_tree_tokens: int = 2**21

    @property
    def max_tree_nodes(self) -> int:
        """The node bound of each replica's prefix tree, derived from `max_tree_tokens` (above)."""
        return max(1024, self.max_tree_tokens // 64)

    def __post_init__(self) -> None:
        check_policy(self.policy)
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(
                "routing cache_threshold is the share of a prompt a replica must already hold to "
                f"win it and must lie in [0, 1], got {self.cache_threshold}"
            )
        if not _is_int(self.balance_abs) or self.balance_abs < 0:
            raise ValueError(
                "routing balance_abs is a number of requests and must be an integer >= 0, got "
                f"{self.balance_abs!r}"
            )
        if not self.balance_rel >= 1.0:
            raise ValueError(
                "routing balance_rel is a ratio of loads and must be >= 1.0 (1.0: any gap over "
                f"balance_abs counts as imbalanced), got {self.balance_rel}"
            )
        if not _is_int(self.max_tree_tokens) or self.max_tree_tokens < 1:
            raise ValueError(
                "routing max_tree_tokens bounds the tokens remembered per replica and must be an "
                f"integer >= 1, got {self.max_tree_tokens!r}"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
