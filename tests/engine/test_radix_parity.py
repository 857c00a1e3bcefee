"""The C++ radix tree and its pure-Python twin agree op for op, and reject bad input alike."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from radixserve.engine.kvcache.radix import CppRadixPrefixCache, PyRadixPrefixCache
from radixserve.native.radix_tree import HANDLE_MESSAGE, UNLOCK_MESSAGE

BACKENDS = pytest.mark.parametrize("Cache", [CppRadixPrefixCache, PyRadixPrefixCache])


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """("ok", result) or (exception type name, message), so both sides compare as values."""
    try:
        return "ok", fn(*args)
    except (TypeError, ValueError, AssertionError) as e:
        return type(e).__name__, str(e).split(" (status")[0]


def assert_same_state(cpp: CppRadixPrefixCache, py: PyRadixPrefixCache) -> None:
    assert cpp.sizes() == py.sizes()
    cpp.check_integrity()
    py.check_integrity()
    assert sorted(cpp.pages()) == sorted(py.pages())


@st.composite
def workloads(draw: st.DrawFn) -> tuple[int, list[tuple]]:
    """A page size and up to 60 ops over sequences that often share prefixes with earlier ones."""
    P = draw(st.sampled_from([1, 4]))
    seqs: list[list[int]] = []
    ops: list[tuple] = []
    for _ in range(draw(st.integers(1, 60))):
        base = draw(st.sampled_from(seqs)) if seqs and draw(st.booleans()) else []
        keep = draw(st.integers(0, len(base)))
        tail = draw(st.lists(st.integers(0, 3), max_size=3 * P))  # tiny alphabet: many splits
        seq = base[:keep] + tail
        seqs.append(seq)
        kind = draw(st.sampled_from(["match", "insert", "insert", "lock", "unlock", "evict"]))
        ops.append((kind, seq, draw(st.integers(0, 40))))
    return P, ops


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_random_ops_agree(workload: tuple[int, list[tuple]]) -> None:
    P, ops = workload
    cpp, py = CppRadixPrefixCache(P), PyRadixPrefixCache(P)
    handles: list[tuple[Any, Any]] = [(None, None)]
    next_page = 0
    for kind, seq, arg in ops:
        tokens = np.asarray(seq, dtype=np.int32)
        if kind == "match":
            a, b = cpp.match(tokens), py.match(tokens)
            assert a.length == b.length and a.locations.tolist() == b.locations.tolist()
            assert a.locations.dtype == torch.int64 == b.locations.dtype
            handles.append((a.handle, b.handle))
        elif kind == "insert":
            aligned = tokens[: len(tokens) // P * P]
            pages = torch.arange(next_page, next_page + len(aligned) // P, dtype=torch.int64)
            next_page += len(pages)
            locs = (pages[:, None] * P + torch.arange(P)).flatten()
            assert cpp.insert(aligned, locs) == py.insert(aligned, locs)
        elif kind in ("lock", "unlock"):
            h_cpp, h_py = handles[arg % len(handles)]
            assert outcome(getattr(cpp, kind), h_cpp) == outcome(getattr(py, kind), h_py)
        else:
            assert cpp.evict(arg % 6) == py.evict(arg % 6)  # same pages, same LRU order
        assert_same_state(cpp, py)
    for h_cpp, h_py in handles:  # a stale handle fails on both; a live one behaves the same
        assert outcome(cpp.lock, h_cpp) == outcome(py.lock, h_py)
    assert_same_state(cpp, py)
    assert sorted(cpp.evict(10**6)) == sorted(py.evict(10**6))


@BACKENDS
def test_unlock_must_name_the_locked_node(Cache: type) -> None:
    c = Cache(1)
    c.insert(np.arange(6, dtype=np.int32), torch.arange(6))
    deep, upper = c.match(np.arange(6, dtype=np.int32)), c.match(np.arange(3, dtype=np.int32))
    c.lock(deep.handle)
    with pytest.raises(ValueError, match=re.escape(UNLOCK_MESSAGE)):
        c.unlock(upper.handle)  # an ancestor passes the lock through but holds none itself
    c.check_integrity()
    c.lock(upper.handle)
    c.unlock(upper.handle)
    c.unlock(deep.handle)
    assert c.sizes() == (6, 0)
    c.check_integrity()


@BACKENDS
def test_empty_inputs_are_valid(Cache: type) -> None:
    c = Cache(4)
    m = c.match(np.zeros(0, np.int32))  # a one-token prompt matches ids[:-1], which is empty
    assert m.length == 0 and m.locations.shape == (0,) and m.locations.dtype == torch.int64
    c.lock(m.handle)
    c.unlock(m.handle)
    assert c.insert(np.zeros(0, np.int32), torch.zeros(0, dtype=torch.int64)) == 0
    assert c.evict(0) == [] and c.evict(5) == [] and c.pages() == []
    assert c.match(np.arange(3, dtype=np.int32)).length == 0  # under a page never matches
    c.lock(None)
    c.unlock(None)
    c.check_integrity()


@BACKENDS
def test_stale_handle_and_unbalanced_unlock(Cache: type) -> None:
    c = Cache(2)
    c.insert(np.arange(6, dtype=np.int32), torch.arange(6))
    m = c.match(np.arange(4, dtype=np.int32))  # splits: the handle names the upper part
    with pytest.raises(ValueError, match=re.escape(UNLOCK_MESSAGE)):
        c.unlock(m.handle)
    assert sorted(c.evict(10)) == [0, 1, 2]
    for op in (c.lock, c.unlock):
        with pytest.raises(ValueError, match=re.escape(HANDLE_MESSAGE)):
            op(m.handle)
    c.insert(np.arange(8, dtype=np.int32), torch.arange(8))  # reuses the freed slots
    with pytest.raises(ValueError, match=re.escape(HANDLE_MESSAGE)):
        c.lock(m.handle)
    assert c.sizes() == (4, 0)
    c.check_integrity()


A = np.arange(8, dtype=np.int32)
L = torch.arange(8)
BAD_CALLS: list[tuple[str, tuple, type, str]] = [
    ("match", (A.astype(np.int64),), TypeError, "tokens must be int32"),
    ("match", (A.astype(np.float32),), TypeError, "tokens must be int32"),
    ("match", (list(A),), TypeError, "numpy array or a CPU torch tensor"),
    ("match", (A[::2],), ValueError, "C-contiguous"),
    ("match", (A.reshape(2, 4),), ValueError, "1-D"),
    ("match", (torch.arange(8, dtype=torch.int32)[::2],), ValueError, "C-contiguous"),
    ("match", (torch.arange(8, dtype=torch.int32, device="meta"),), ValueError, "CPU"),
    ("insert", (A[:6], L[:6]), ValueError, "multiple of page_size"),
    ("insert", (A, L[:4]), ValueError, "one entry per token"),
    ("insert", (A, L.int()), TypeError, "locations must be int64"),
    ("insert", (torch.arange(8, dtype=torch.int32), L), None, ""),
    ("insert", (A, torch.arange(16)[::2]), ValueError, "C-contiguous"),
    ("insert", (A.astype(np.int64), L), TypeError, "tokens must be int32"),
    ("evict", (-1,), ValueError, "num_pages must be >= 0"),
    ("evict", (1.5,), TypeError, "num_pages must be an int"),
    ("lock", ("x",), TypeError, "handle must"),
    ("unlock", (1.5,), TypeError, "handle must"),
]


@BACKENDS
@pytest.mark.parametrize("method, args, exc, text", BAD_CALLS)
def test_rejects_bad_arguments(Cache: type, method: str, args: tuple, exc: Any, text: str) -> None:
    c = Cache(4)
    if exc is None:  # CPU int32 tensors are fine as tokens
        getattr(c, method)(*args)
    else:
        with pytest.raises(exc, match=text):
            getattr(c, method)(*args)
    c.check_integrity()


@BACKENDS
def test_bad_page_size(Cache: type) -> None:
    with pytest.raises(ValueError, match="page_size"):
        Cache(0)
    with pytest.raises(TypeError, match="page_size"):
        Cache("4")


def test_cpp_rejects_forged_handles() -> None:
    c = CppRadixPrefixCache(1)
    c.insert(A, L)
    real = c.match(A).handle
    for forged in (-1, 2**64, real + (1 << 32), real + 12345, (7 << 32) | 0):
        with pytest.raises(ValueError, match=re.escape(HANDLE_MESSAGE)):
            c.lock(forged)
    with pytest.raises(TypeError, match="handle must"):
        c.lock(True)
    c.lock(real)
    assert c.sizes() == (0, 8)
    c.check_integrity()


def test_fallback_is_the_python_twin() -> None:
    code = (
        "import sys; sys.modules['radixserve.native._prefix'] = None\n"
        "import numpy as np, torch\n"
        "from radixserve.engine.kvcache.radix import RadixPrefixCache\n"
        "c = RadixPrefixCache(1); c.insert(np.arange(4, dtype=np.int32), torch.arange(4))\n"
        "print(RadixPrefixCache.__name__, c.match(np.arange(3, dtype=np.int32)).length)"
    )
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "PyRadixPrefixCache 3"
    assert done.stderr.count("RuntimeWarning") == 1 and "pip install -e ." in done.stderr
