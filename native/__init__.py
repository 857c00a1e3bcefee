"""The C++ radix tree (radix_tree.py) and the one loader of its compiled cffi module.

Without the build, the engine runs the radix cache's pure-Python twin (engine/kvcache/radix_py.py)
and importing this package emits one warning.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Literal, NamedTuple


class Native(NamedTuple):
    ffi: Any
    lib: Any


@functools.cache
def load() -> Native | None:
    """The compiled module's `ffi` and `lib`, or None when it was not built."""
    try:
        from radixserve.native._prefix import ffi, lib  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return Native(ffi, lib)


NATIVE_AVAILABLE: bool = load() is not None

if not NATIVE_AVAILABLE:
    warnings.warn(
        "radixserve.native: C++ radix tree not built, using the slow pure-Python fallback; "
        "build it with `pip install -e .` (or `make install`)",
        RuntimeWarning,
        stacklevel=2,
    )


def backend_name() -> Literal["cpp", "python"]:
    """Which implementation the radix prefix cache runs on."""
    return "cpp" if NATIVE_AVAILABLE else "python"


__all__ = ["NATIVE_AVAILABLE", "Native", "backend_name", "load"]
