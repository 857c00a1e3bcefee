"""Python face of the C++ radix tree (radix_tree.h), plus the argument checks both backends share.

`RadixTree` is numpy-only (this package never imports torch); engine/kvcache/radix.py adapts it to
the PrefixCache interface. The pure-Python twin (engine/kvcache/radix_py.py) runs the same checks
below, so both backends reject the same inputs with the same exception and message. Arguments are
checked twice on purpose (docs/conventions.md #9): here, so a user gets a TypeError or ValueError
naming the bad argument, and again in C++, so nothing reaches a pointer unchecked.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import numpy as np
from radixserve.native import load

if TYPE_CHECKING:
    import torch

TokenArray = Union[np.ndarray, "torch.Tensor"]

_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)
_TORCH_DTYPES = {"torch.int32", "torch.int64"}
_MAX_HANDLE = 2**64 - 1

# Same text as rs_strerror of RS_ERR_HANDLE / RS_ERR_UNLOCK, so both backends say the same thing.
HANDLE_MESSAGE = "handle names no live node (stale: evicted since the match)"
UNLOCK_MESSAGE = "unlock without a matching lock"


def as_array(x: TokenArray, name: str, dtypes: tuple[np.dtype, ...]) -> np.ndarray:
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


class TreeMatch(NamedTuple):
    length: int  # matched tokens, a multiple of page_size
    locations: np.ndarray  # (length,) int64 KV locations
    handle: int  # (generation << 32) | node slot; 0 is the root (nothing matched)


def check_page_size(page_size: object) -> int:
    if isinstance(page_size, bool) or not isinstance(page_size, int):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
    if not 1 <= page_size <= 2**30:
        raise ValueError(f"page_size must be in [1, 2**30], got {page_size}")
    return page_size


def check_tokens(tokens: TokenArray) -> np.ndarray:
    """(n,) int32, C-contiguous, CPU; numpy or torch, never copied."""
    return as_array(tokens, "tokens", (_I32,))


def check_insert(
    tokens: TokenArray, locations: TokenArray, page_size: int
) -> tuple[np.ndarray, np.ndarray]:
    tokens = check_tokens(tokens)
    locations = as_array(locations, "locations", (_I64,))
    if len(tokens) != len(locations):
        raise ValueError(
            "tokens and locations must have one entry per token, "
            f"got {len(tokens)} and {len(locations)}"
        )
    if len(tokens) % page_size:
        raise ValueError(
            f"insert length must be a multiple of page_size {page_size}, got {len(tokens)}"
        )
    return tokens, locations


def check_num_pages(num_pages: object) -> int:
    if isinstance(num_pages, bool):
        raise TypeError("num_pages must be an int, got bool")
    try:
        n = operator.index(num_pages)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"num_pages must be an int, got {type(num_pages).__name__}") from None
    if n < 0:
        raise ValueError(f"num_pages must be >= 0, got {n}")
    return n


class RadixTree:
    """The C++ radix tree: one owner of nodes, locks, LRU order and sizes. See radix_tree.h."""

    def __init__(self, page_size: int) -> None:
        self.page_size = check_page_size(page_size)
        native = load()
        if native is None:
            raise ImportError("radixserve.native._prefix is not built; run `pip install -e .`")
        self._ffi, self._lib = native.ffi, native.lib
        out = self._ffi.new("RsRadixTree**")
        self._raise_for(self._lib.rs_radix_new(self.page_size, out))
        self._tree = self._ffi.gc(out[0], self._lib.rs_radix_free)
        self._len = self._ffi.new("int64_t[2]")  # scratch out-params, reused by every call
        self._handle = self._ffi.new("uint64_t[1]")

    def _raise_for(self, status: int) -> None:
        if not status:
            return
        message = f"radixserve.native: {self._ffi.string(self._lib.rs_strerror(status)).decode()}"
        if status == self._lib.RS_ERR_NOMEM:
            raise MemoryError(message)
        if status >= self._lib.RS_BROKEN_EDGE:
            raise AssertionError(f"{message} (status {status})")
        raise ValueError(f"{message} (status {status})")

    def _buffer(self, ctype: str, array: np.ndarray) -> Any:
        return self._ffi.from_buffer(ctype, array) if len(array) else self._ffi.NULL

    def _handle_arg(self, handle: object) -> int:
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise TypeError(f"handle must be an int from match(), got {type(handle).__name__}")
        if not 0 <= handle <= _MAX_HANDLE:
            raise ValueError(f"radixserve.native: {HANDLE_MESSAGE}")
        return handle

    def match(self, tokens: TokenArray) -> TreeMatch:
        """Longest cached page-aligned prefix; splits a part-matched edge, stamps the path."""
        tokens = check_tokens(tokens)
        out = np.empty(len(tokens) // self.page_size * self.page_size, _I64)
        status = self._lib.rs_radix_match(
            self._tree, self._buffer("int32_t[]", tokens), len(tokens),
            self._buffer("int64_t[]", out), len(out), self._len, self._handle,
        )  # fmt: skip
        self._raise_for(status)
        length = int(self._len[0])
        return TreeMatch(length, out[:length], int(self._handle[0]))

    def lock(self, handle: int | None) -> None:
        """Protect the handle's path up to the root; None (or the root's handle 0) does nothing."""
        if handle is not None:
            self._raise_for(self._lib.rs_radix_lock(self._tree, self._handle_arg(handle)))

    def unlock(self, handle: int | None) -> None:
        if handle is not None:
            self._raise_for(self._lib.rs_radix_unlock(self._tree, self._handle_arg(handle)))

    def insert(self, tokens: TokenArray, locations: TokenArray) -> int:
        """Caches the tokens' locations (copied); returns the length that was already cached."""
        tokens, locations = check_insert(tokens, locations, self.page_size)
        status = self._lib.rs_radix_insert(
            self._tree, self._buffer("int32_t[]", tokens), self._buffer("int64_t[]", locations),
            len(tokens), self._len,
        )  # fmt: skip
        self._raise_for(status)
        return int(self._len[0])

    def evict(self, num_pages: int) -> list[int]:
        num_pages = check_num_pages(num_pages)
        out = np.empty(self.sizes()[0] if num_pages else 0, _I64)  # what one call can free
        status = self._lib.rs_radix_evict(
            self._tree, num_pages, self._buffer("int64_t[]", out), len(out), self._len
        )
        self._raise_for(status)
        freed: list[int] = out[: int(self._len[0])].tolist()
        return freed

    def sizes(self) -> tuple[int, int]:
        """(evictable_pages, protected_pages)."""
        self._raise_for(self._lib.rs_radix_sizes(self._tree, self._len, self._len + 1))
        return int(self._len[0]), int(self._len[1])

    def check_integrity(self) -> None:
        """Raises AssertionError naming the first broken invariant."""
        self._raise_for(self._lib.rs_radix_check(self._tree))

    def pages(self) -> list[int]:
        """Every cached page id, depth-first."""
        out = np.empty(sum(self.sizes()), _I64)
        status = self._lib.rs_radix_pages(
            self._tree, self._buffer("int64_t[]", out), len(out), self._len
        )
        self._raise_for(status)
        held: list[int] = out[: int(self._len[0])].tolist()
        return held
