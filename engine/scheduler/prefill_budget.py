"""How much prefill one step takes: `max_prefill_tokens`, counted in tokens or in compute.

A prompt token costs its projections, the same at any position, plus attention to every key up
to it, which grows with its position. Counted in tokens ("tokens"), a chunk deep into a long
prompt costs several times a chunk at its start, so the steps that carry it run long, and so do
the gaps of every stream decoding beside them. Counted in compute ("compute"), the token at
position p costs 1 + (p + 1) / R, where R is how many attended keys cost as much as one token's
projections (`keys_per_token`: 3,840 for Qwen3-0.6B, 23,552 for Qwen3-8B). A chunk then
shrinks as its prompt's prefix grows, and every step's prefill holds about the same compute:

    budget 4,096, Qwen3-0.6B (R = 3,840):
      from position      0: a chunk of 2,957 tokens
      from position 12,000: a chunk of   963 tokens
"""

from __future__ import annotations

import math
from typing import Literal

from radixserve.engine.causal import attended_keys

BudgetUnit = Literal["tokens", "compute"]


def keys_per_token(hidden: int, intermediate: int, num_heads: int, num_kv_heads: int,
                   head_dim: int) -> float:
    """Attended keys that cost as many FLOPs as one token's projections, per layer: the q/k/v, o
    and gated-MLP matmuls (2 FLOPs a weight) over the scores and the weighted sum (4 FLOPs per
    head dimension and head, per key)."""
    weights = (hidden * (num_heads + 2 * num_kv_heads) * head_dim  # q, k, v
               + num_heads * head_dim * hidden  # o
               + 3 * hidden * intermediate)  # gate, up, down
    return 2 * weights / (4 * num_heads * head_dim)


class PrefillBudget:
    def __init__(self, unit: BudgetUnit = "tokens", keys_per_token: float | None = None) -> None:
        if unit == "compute" and not (keys_per_token and keys_per_token > 0):
            raise ValueError("a compute budget needs the model's keys_per_token")
        self._r = keys_per_token if unit == "compute" else None  # None: count tokens

    def cost(self, start: int, end: int) -> float:
        """The budget that prefilling positions [start, end) of one prompt takes."""
        if self._r is None:
            return float(end - start)
        return end - start + attended_keys(start, end) / self._r

    def chunk_end(self, start: int, limit: int, budget: float) -> int:
        """The end of the longest chunk [start, end), end <= limit, whose cost fits `budget`;
        at least one token (so that a positive budget always makes progress)."""
        if self._r is None:
            return min(limit, start + max(1, int(budget)))
        # cost(start, start + c) = c + (c * (2 * start + 1) + c * c) / (2 * R): a quadratic in c
        a, b = 1 / (2 * self._r), 1 + (2 * start + 1) / (2 * self._r)
        c = int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a))
        while c > 1 and self.cost(start, start + c) > budget:  # float rounding, either way
            c -= 1
        while start + c < limit and self.cost(start, start + c + 1) <= budget:
            c += 1
        return min(limit, start + max(1, c))
