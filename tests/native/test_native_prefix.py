"""The C++ prefix helpers agree with the pure-Python twin and a plain-loop reference, and both
reject bad input with the same exception instead of crashing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from radixserve import native
from radixserve.native import MatchResult, PackedKeys, pack_keys
from radixserve.native import prefix as cpp
from radixserve.native import prefix_py as py

DTYPES = [np.int32, np.int64]
FIRST_MISMATCH = [cpp.first_mismatch, py.first_mismatch]
MATCH_CHILDREN = [cpp.match_children, py.match_children]


def ref_mismatch(a: np.ndarray, b: np.ndarray) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def ref_match(prompt: np.ndarray, offset: int, keys: list[np.ndarray]) -> MatchResult:
    best = MatchResult(-1, 0)
    for i, key in enumerate(keys):
        length = ref_mismatch(key, prompt[offset:])
        if length > best.length:
            best = MatchResult(i, length)
    return best


@st.composite
def token_pair(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """b shares a drawn-length prefix with a, then diverges, so mismatch positions cover the range."""
    dtype = draw(st.sampled_from(DTYPES))
    info = np.iinfo(dtype)
    alphabet = st.sampled_from([0, 1, 2, -1, int(info.min), int(info.max)])
    a = np.array(draw(st.lists(alphabet, max_size=300)), dtype=dtype)
    if draw(st.booleans()):  # long arrays: cross the 64 B and 1 KiB chunks of the fast path
        a = np.tile(a, draw(st.integers(1, 40))) if len(a) else a
    keep = draw(st.integers(0, len(a)))
    tail = np.array(draw(st.lists(alphabet, max_size=20)), dtype=dtype)
    return a, np.concatenate([a[:keep], tail])


@settings(max_examples=400, deadline=None)
@given(token_pair())
def test_first_mismatch_agrees(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = pair
    want = ref_mismatch(a, b)
    for fn in FIRST_MISMATCH:
        assert fn(a, b) == want
        assert fn(b, a) == want


@settings(max_examples=300, deadline=None)
@given(token_pair(), st.data())
def test_match_children_agrees(pair: tuple[np.ndarray, np.ndarray], data: st.DataObject) -> None:
    prompt, other = pair
    offset = data.draw(st.integers(0, len(prompt)))
    rest = prompt[offset:]
    keys = []
    for _ in range(data.draw(st.integers(0, 6))):
        cut = data.draw(st.integers(0, len(rest)))
        keys.append(data.draw(st.sampled_from([rest[:cut], other[:cut], rest[cut:], rest])))
    packed = pack_keys(keys, prompt.dtype)
    want = ref_match(prompt, offset, keys)
    for fn in MATCH_CHILDREN:
        assert fn(prompt, offset, packed) == want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", FIRST_MISMATCH)
def test_first_mismatch_edges(fn: Callable[..., int], dtype: type) -> None:
    empty, x = np.zeros(0, dtype), np.arange(5000, dtype=dtype)
    assert fn(empty, empty) == 0 and fn(empty, x) == 0 and fn(x, x.copy()) == 5000
    for pos in [0, 1, 15, 16, 255, 256, 1023, 1024, 4999]:  # chunk boundaries of the fast path
        y = x.copy()
        y[pos] += 1
        assert fn(x, y) == pos
    assert fn(x, x[:4321].copy()) == 4321
    assert fn(torch.from_numpy(x), torch.from_numpy(x[:7].copy())) == 7


@pytest.mark.parametrize("fn", MATCH_CHILDREN)
def test_match_children_edges(fn: Callable[..., MatchResult]) -> None:
    prompt = np.array([5, 6, 7, 8], np.int32)
    keys = pack_keys([[], [6, 9], [6, 7, 8, 1], [6, 7, 8], [1]])
    assert fn(prompt, 1, keys) == MatchResult(2, 3)  # tie between 2 and 3: lowest index
    assert fn(prompt, 0, keys) == MatchResult(-1, 0)
    assert fn(prompt, 4, keys) == MatchResult(-1, 0)  # nothing left to match
    assert fn(prompt, 1, pack_keys([])) == MatchResult(-1, 0)
    assert fn(torch.tensor([6, 7], dtype=torch.int32), 0, keys) == MatchResult(2, 2)
    prompt.setflags(write=False)  # read-only buffers (e.g. memory-mapped) are fine
    assert fn(prompt, 1, keys) == MatchResult(2, 3)


def test_large_match() -> None:
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 32000, 100_000, dtype=np.int64)
    keys = [prompt[:90_000], prompt[:50_000], rng.integers(0, 32000, 100, dtype=np.int64)]
    keys.append(np.concatenate([prompt[:99_999], [-1]]))
    for fn in MATCH_CHILDREN:
        assert fn(prompt, 0, pack_keys(keys, np.int64)) == MatchResult(3, 99_999)


A = np.arange(8, dtype=np.int32)
BAD_PAIRS = [
    (A[::2], A[:4], ValueError, "C-contiguous"),
    (A.reshape(2, 4), A, ValueError, "1-D"),
    (np.array(3, np.int32), A, ValueError, "1-D"),
    (A, A.astype(np.int64), TypeError, "share a dtype"),
    (A.astype(np.float32), A.astype(np.float32), TypeError, "int32 or int64"),
    (A.astype(np.int16), A.astype(np.int16), TypeError, "int32 or int64"),
    (A.astype(np.uint32), A.astype(np.uint32), TypeError, "int32 or int64"),
    (A.astype(">i4"), A.astype(">i4"), TypeError, "int32 or int64"),
    ([1, 2], A, TypeError, "numpy array or a CPU torch tensor"),
    (torch.arange(8, dtype=torch.float32), A, TypeError, "int32 or int64"),
    (torch.arange(8, device="meta"), A, ValueError, "CPU"),
    (torch.arange(8, dtype=torch.int32)[::2], A[:4], ValueError, "C-contiguous"),
]


@pytest.mark.parametrize("fn", FIRST_MISMATCH)
@pytest.mark.parametrize("a, b, exc, text", BAD_PAIRS)
def test_first_mismatch_rejects(fn: Callable, a: object, b: object, exc: type, text: str) -> None:
    with pytest.raises(exc, match=text):
        fn(a, b)


OFFSETS = np.array([0, 2, 4], np.int64)
BAD_MATCHES = [
    (A, -1, PackedKeys(A[:4], OFFSETS), ValueError, "offset must be in"),
    (A, 9, PackedKeys(A[:4], OFFSETS), ValueError, "offset must be in"),
    (A, 1.0, PackedKeys(A[:4], OFFSETS), TypeError, "integer"),
    (A, 0, PackedKeys(A[:4], np.array([0, 3, 2], np.int64)), ValueError, "non-decreasing"),
    (A, 0, PackedKeys(A[:4], np.array([0, 2, 5], np.int64)), ValueError, "non-decreasing"),
    (A, 0, PackedKeys(A[:4], np.array([-1, 2], np.int64)), ValueError, "non-decreasing"),
    (A, 0, PackedKeys(A[:4], np.zeros(0, np.int64)), ValueError, "num_keys \\+ 1"),
    (A, 0, PackedKeys(A[:4], OFFSETS.astype(np.int32)), TypeError, "int64"),
    (A, 0, PackedKeys(A[:4], np.zeros((3, 1), np.int64)), ValueError, "1-D"),
    (A, 0, PackedKeys(A[:4].astype(np.int64), OFFSETS), TypeError, "share a dtype"),
    (A, 0, PackedKeys(A[:8:2], OFFSETS), ValueError, "C-contiguous"),
    (A[::2], 0, PackedKeys(A[:4], OFFSETS), ValueError, "C-contiguous"),
    (A, 0, [A], TypeError, "PackedKeys"),
    (A, 0, None, TypeError, "PackedKeys"),
]


@pytest.mark.parametrize("fn", MATCH_CHILDREN)
@pytest.mark.parametrize("prompt, offset, keys, exc, text", BAD_MATCHES)
def test_match_children_rejects(
    fn: Callable, prompt: object, offset: object, keys: object, exc: type, text: str
) -> None:
    with pytest.raises(exc, match=text):
        fn(prompt, offset, keys)


def test_pack_keys() -> None:
    packed = pack_keys([np.array([1, 2], np.int64), [], torch.tensor([3])], np.int32)
    assert packed.tokens.dtype == np.int32 and packed.tokens.tolist() == [1, 2, 3]
    assert packed.offsets.tolist() == [0, 2, 2, 3] and packed.num_keys == 3
    with pytest.raises(ValueError, match="outside"):
        pack_keys([[2**31]], np.int32)
    with pytest.raises(TypeError, match="integers"):
        pack_keys([[1.5]])
    with pytest.raises(ValueError, match="1-D"):
        pack_keys([[[1]]])


def test_c_checks_its_own_arguments() -> None:
    """Called straight through cffi, bad pointers and lengths give a status, not a crash."""
    loaded = cpp.load()
    assert loaded is not None
    ffi, lib = loaded.ffi, loaded.lib
    out, null = ffi.new("int64_t[2]"), ffi.NULL
    buf = ffi.new("int32_t[]", [1, 2, 3])
    offs = ffi.new("int64_t[]", [0, 3])
    assert lib.rs_first_mismatch_i32(null, 0, null, 0, out) == 0 and out[0] == 0
    assert lib.rs_first_mismatch_i32(buf, 3, buf, 3, null) == lib.RS_ERR_NULL
    assert lib.rs_first_mismatch_i32(null, 1, buf, 3, out) == lib.RS_ERR_NULL
    assert lib.rs_first_mismatch_i32(buf, -1, buf, 3, out) == lib.RS_ERR_LENGTH
    assert lib.rs_match_children_i32(buf, 3, 4, buf, 3, offs, 1, out, out + 1) == lib.RS_ERR_OFFSET
    assert lib.rs_match_children_i32(buf, 3, 0, buf, 2, offs, 1, out, out + 1) == (
        lib.RS_ERR_KEY_OFFSETS
    )
    assert lib.rs_match_children_i32(buf, 3, 0, buf, 3, null, 1, out, out + 1) == lib.RS_ERR_NULL
    assert lib.rs_match_children_i32(buf, 3, 0, buf, 3, offs, -1, out, out + 1) == (
        lib.RS_ERR_LENGTH
    )
    text = ffi.string(lib.rs_strerror(lib.RS_ERR_KEY_OFFSETS)).decode()
    assert text == cpp.KEY_OFFSETS_MESSAGE
    assert ffi.string(lib.rs_strerror(12345)) == b"unknown status"


def test_compiled_module_in_use() -> None:
    assert native.NATIVE_AVAILABLE, "radixserve.native._prefix is not built: run `pip install -e .`"
    assert native.backend_name() == "cpp"
    assert native.first_mismatch is cpp.first_mismatch
    assert native.match_children is cpp.match_children


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_fallback_warns_and_matches() -> None:
    out = _run(
        "import sys; sys.modules['radixserve.native._prefix'] = None\n"
        "import numpy as np, radixserve.native as n\n"
        "a = np.arange(9, dtype=np.int32)\n"
        "print(n.backend_name(), n.first_mismatch(a, a[:5].copy()))"
    )
    assert "python 5" in out
    assert "pip install -e ." in out and "RuntimeWarning" in out


def test_import_is_light() -> None:
    out = _run("import sys, radixserve.native; print('torch' in sys.modules)")
    assert out.strip() == "False"
