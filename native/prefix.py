"""Owner of the compiled prefix helpers: loads `ffi`/`lib` once, validates inputs, maps status codes.

Argument checking happens twice on purpose (docs/conventions.md #9): here, so a user gets a
TypeError or ValueError naming the bad argument, and again in C++, so nothing reaches a pointer
unchecked. The pure-Python twin (prefix_py.py) reuses the checks below, so both backends reject the
same inputs with the same messages.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import numpy as np

if TYPE_CHECKING:
    import torch

TokenArray = Union[np.ndarray, "torch.Tensor"]

_TOKEN_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_OFFSET_DTYPE = np.dtype(np.int64)
_TORCH_DTYPES = {"torch.int32", "torch.int64"}

# Same text as rs_strerror(RS_ERR_KEY_OFFSETS), so both backends raise the same message.
KEY_OFFSETS_MESSAGE = "key offsets must be non-decreasing within [0, len(keys)]"


class MatchResult(NamedTuple):
    """Best child for prompt[offset:]; child_index is -1 (and length 0) when none matches."""

    child_index: int
    length: int


class PackedKeys(NamedTuple):
    """Candidate keys back to back: key i is tokens[offsets[i]:offsets[i + 1]]."""

    tokens: np.ndarray  # (total_len,) int32 or int64, C-contiguous
    offsets: np.ndarray  # (num_keys + 1,) int64, non-decreasing

    @property
    def num_keys(self) -> int:
        return len(self.offsets) - 1


def pack_keys(keys: Sequence[Any], dtype: type | np.dtype = np.int32) -> PackedKeys:
    """Packs 1-D integer keys (arrays, tensors or lists) into one buffer; build once per node."""
    want = np.dtype(dtype)
    if want not in _TOKEN_DTYPES:
        raise TypeError(f"dtype must be int32 or int64, got {want}")
    info = np.iinfo(want)
    arrays = []
    for i, key in enumerate(keys):
        arr = np.asarray(key.cpu() if hasattr(key, "cpu") else key)
        if arr.ndim != 1:
            raise ValueError(f"keys[{i}] must be 1-D, got shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"keys[{i}] must hold integers, got {arr.dtype}")
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise ValueError(f"keys[{i}] has token ids outside the {want} range")
        arrays.append(arr.astype(want, copy=False))
    offsets = np.zeros(len(arrays) + 1, dtype=_OFFSET_DTYPE)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=want)
    return PackedKeys(np.ascontiguousarray(tokens, dtype=want), offsets)


def as_array(x: TokenArray, name: str, dtypes: tuple[np.dtype, ...] = _TOKEN_DTYPES) -> np.ndarray:
    """Returns x as a 1-D C-contiguous numpy array of one of `dtypes`, without copying."""
    if not isinstance(x, np.ndarray):
        x = _from_torch(x, name)
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {x.shape}")
    if x.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must be {allowed} (native byte order), got {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous; pass np.ascontiguousarray({name})")
    return x


def _from_torch(x: Any, name: str) -> np.ndarray:
    # Duck-typed so this module never imports torch; .numpy() is a zero-copy view on CPU.
    if type(x).__module__.split(".")[0] != "torch" or not hasattr(x, "device"):
        raise TypeError(
            f"{name} must be a numpy array or a CPU torch tensor, got {type(x).__name__}"
        )
    if x.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got device {x.device}")
    if str(x.dtype) not in _TORCH_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {x.dtype}")
    view: np.ndarray = x.detach().numpy()
    return view


def check_pair(a: TokenArray, b: TokenArray) -> tuple[np.ndarray, np.ndarray]:
    a, b = as_array(a, "a"), as_array(b, "b")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    return a, b


def check_match(
    prompt: TokenArray, offset: int, keys: PackedKeys
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    prompt = as_array(prompt, "prompt")
    try:
        tokens, offsets = keys
    except (TypeError, ValueError):
        raise TypeError(
            "keys must be a PackedKeys(tokens, offsets); build it with pack_keys"
        ) from None
    tokens = as_array(tokens, "keys.tokens")
    offsets = as_array(offsets, "keys.offsets", (_OFFSET_DTYPE,))
    if tokens.dtype != prompt.dtype:
        raise TypeError(
            f"prompt and keys must share a dtype, got {prompt.dtype} and {tokens.dtype}"
        )
    if len(offsets) == 0:
        raise ValueError("keys.offsets needs num_keys + 1 entries, got an empty array")
    offset = operator.index(offset)
    if not 0 <= offset <= len(prompt):
        raise ValueError(f"offset must be in [0, {len(prompt)}], got {offset}")
    return prompt, offset, tokens, offsets


class _Kernels(NamedTuple):
    ctype: str  # cffi array type of the token buffers
    first_mismatch: Callable[..., int]
    match_children: Callable[..., int]


class _Native(NamedTuple):
    ffi: Any
    lib: Any
    kernels: dict[np.dtype, _Kernels]  # one lookup per call picks the dtype's entry points


@functools.cache
def load() -> _Native | None:
    """The compiled module, or None when it was not built (then prefix_py is used)."""
    try:
        from radixserve.native._prefix import ffi, lib  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    i32, i64 = _TOKEN_DTYPES
    return _Native(
        ffi,
        lib,
        {
            i32: _Kernels("int32_t[]", lib.rs_first_mismatch_i32, lib.rs_match_children_i32),
            i64: _Kernels("int64_t[]", lib.rs_first_mismatch_i64, lib.rs_match_children_i64),
        },
    )


def _native() -> _Native:
    native = load()
    if native is None:
        raise ImportError("radixserve.native._prefix is not built; run `pip install -e .`")
    return native


def _raise_for(native: _Native, status: int) -> None:
    message = native.ffi.string(native.lib.rs_strerror(status)).decode()
    raise ValueError(f"radixserve.native: {message} (status {status})")


def first_mismatch(a: TokenArray, b: TokenArray) -> int:
    """Index of the first position where a and b differ, or min(len(a), len(b)) if none does."""
    a, b = check_pair(a, b)
    native = _native()
    ffi, kernels = native.ffi, native.kernels[a.dtype]
    out = ffi.new("int64_t[1]")
    status = kernels.first_mismatch(
        ffi.from_buffer(kernels.ctype, a), len(a), ffi.from_buffer(kernels.ctype, b), len(b), out
    )
    if status:
        _raise_for(native, status)
    return int(out[0])


def match_children(prompt: TokenArray, offset: int, keys: PackedKeys) -> MatchResult:
    """The key sharing the longest prefix with prompt[offset:] (lowest index on ties)."""
    prompt, offset, tokens, offsets = check_match(prompt, offset, keys)
    native = _native()
    ffi, kernels = native.ffi, native.kernels[prompt.dtype]
    out = ffi.new("int64_t[2]")
    status = kernels.match_children(
        ffi.from_buffer(kernels.ctype, prompt), len(prompt), offset,
        ffi.from_buffer(kernels.ctype, tokens), len(tokens),
        ffi.from_buffer("int64_t[]", offsets), len(offsets) - 1,
        out, out + 1,
    )  # fmt: skip
    if status:
        _raise_for(native, status)
    return MatchResult(int(out[0]), int(out[1]))
