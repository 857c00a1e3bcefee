"""The request lists `radixserve bench serving` sends: (prompt ids, output tokens) per request.

Prompts are token ids (no tokenizer in the loop) below min(vocab, 10000), never 0.

  random         prompt and output lengths uniform in [len * (1 - range_ratio), len].
  shared-prefix  G groups x R requests; a group's requests start with the same L random ids (its
                 "system prompt", drawn per group) and end with S ids of their own; every request
                 decodes exactly the output length. The list is shuffled, so a group's requests
                 arrive spread over the run, and a prefix cache (or a cache-aware router) has to
                 find the group again rather than see its requests back to back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Workload = Literal["random", "shared-prefix"]
WORKLOADS: tuple[Workload, ...] = ("random", "shared-prefix")
Work = list[tuple[list[int], int]]  # (prompt ids, max_new_tokens) per request, in sending order


@dataclass(frozen=True)
class SharedPrefix:
    groups: int = 64
    per_group: int = 16
    prefix_len: int = 2048
    suffix_len: int = 64

    def __post_init__(self) -> None:
        if min(self.groups, self.per_group, self.prefix_len, self.suffix_len) < 1:
            raise ValueError("groups, per-group, prefix-len and suffix-len must be >= 1")

    @property
    def num_requests(self) -> int:
        return self.groups * self.per_group


def _id_range(vocab: int) -> int:
    high = min(vocab, 10000)
    if high < 2:
        raise ValueError(f"a vocabulary of {vocab} has no token id to draw")
    return high


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    high = _id_range(vocab)
    return [rng.randrange(1, high) for _ in range(n)]


def random_work(num_prompts: int, input_len: int, output_len: int, range_ratio: float, vocab: int,
                seed: int) -> Work:
    rng = random.Random(seed)
    high = _id_range(vocab)

    def length(n: int) -> int:
        return rng.randint(max(1, int(n * (1 - range_ratio))), n)

    return [([rng.randrange(1, high) for _ in range(length(input_len))], length(output_len))
            for _ in range(num_prompts)]


def shared_prefix_work(spec: SharedPrefix, output_len: int, vocab: int, seed: int) -> Work:
    """spec.groups x spec.per_group requests, shuffled with `seed` (the same seed, the same list).
    Suffixes are distinct within a group, so no two requests share more than their prefix."""
    if (_id_range(vocab) - 1) ** spec.suffix_len < spec.per_group:
        raise ValueError(f"{spec.per_group} distinct suffixes of {spec.suffix_len} ids do not "
                         f"exist in a vocabulary of {vocab}")
    rng = random.Random(seed)
    work: Work = []
    for _ in range(spec.groups):
        prefix = random_ids(rng, spec.prefix_len, vocab)
        seen: set[tuple[int, ...]] = set()
        while len(seen) < spec.per_group:
            suffix = tuple(random_ids(rng, spec.suffix_len, vocab))
            if suffix not in seen:  # a repeat is only likely with tiny suffixes and vocabularies
                seen.add(suffix)
                work.append((prefix + list(suffix), output_len))
    rng.shuffle(work)
    return work


def warm_up_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Prompts for warming the path, drawn apart from any workload's so they seed no cache hit."""
    rng = random.Random(f"warm-up {seed}")
    return [random_ids(rng, length, vocab) for _ in range(count)]
