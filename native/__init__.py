"""Prefix-matching helpers for the radix cache: C++ via cffi, or a pure-Python twin if unbuilt.

first_mismatch(a, b) -> int
match_children(prompt, offset, keys: PackedKeys) -> MatchResult(child_index, length)
pack_keys(keys, dtype=np.int32) -> PackedKeys
"""

from __future__ import annotations

import warnings
from typing import Literal

from radixserve.native.prefix import MatchResult, PackedKeys, TokenArray, load, pack_keys

NATIVE_AVAILABLE: bool = load() is not None

if NATIVE_AVAILABLE:
    from radixserve.native.prefix import first_mismatch, match_children
else:
    warnings.warn(
        "radixserve.native: C++ prefix helpers not built, using the slow pure-Python fallback; "
        "build them with `pip install -e .` (or `make install`)",
        RuntimeWarning,
        stacklevel=2,
    )
    from radixserve.native.prefix_py import first_mismatch, match_children


def backend_name() -> Literal["cpp", "python"]:
    """Which implementation `first_mismatch` and `match_children` run on."""
    return "cpp" if NATIVE_AVAILABLE else "python"


__all__ = [
    "NATIVE_AVAILABLE",
    "MatchResult",
    "PackedKeys",
    "TokenArray",
    "backend_name",
    "first_mismatch",
    "match_children",
    "pack_keys",
]
