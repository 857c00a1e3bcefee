"""Pure-Python twin of the compiled helpers: same results, same errors, used only without the build.

It is also the reference the property tests hold the C++ code to, so it favours the obvious loop
over cleverness. Inputs are validated by the shared checks in prefix.py.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
from radixserve.native.prefix import (
    KEY_OFFSETS_MESSAGE,
    MatchResult,
    PackedKeys,
    TokenArray,
    check_match,
    check_pair,
)


def _mismatch(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def first_mismatch(a: TokenArray, b: TokenArray) -> int:
    """Index of the first position where a and b differ, or min(len(a), len(b)) if none does."""
    return _mismatch(*check_pair(a, b))


def match_children(prompt: TokenArray, offset: int, keys: PackedKeys) -> MatchResult:
    """The key sharing the longest prefix with prompt[offset:] (lowest index on ties)."""
    prompt, offset, tokens, offsets = check_match(prompt, offset, keys)
    bounds = offsets.tolist()
    if bounds[0] < 0 or bounds[-1] > len(tokens) or any(x > y for x, y in pairwise(bounds)):
        raise ValueError(f"radixserve.native: {KEY_OFFSETS_MESSAGE}")
    rest = prompt[offset:]
    if len(rest) == 0:
        return MatchResult(-1, 0)
    head = rest[0]
    best = MatchResult(-1, 0)
    for i, (start, end) in enumerate(pairwise(bounds)):
        # Radix siblings differ in their first token: skip the numpy call for all but one.
        if end > start and tokens[start] == head:
            length = _mismatch(tokens[start:end], rest)
            if length > best.length:
                best = MatchResult(i, length)
    return best
