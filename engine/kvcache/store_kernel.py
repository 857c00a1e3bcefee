"""One Triton launch writes a layer's new K and V into the paged pool.

The plain path is two `index_copy_` calls (plus casts); this kernel does both rows of a token in one
program and reads k/v through their row stride, so the strided v view out of the fused QKV
projection needs no copy first.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the pool falls back to index_copy_
    triton = None


def available(t: torch.Tensor) -> bool:
    return triton is not None and t.is_cuda


def packed(x: torch.Tensor) -> bool:
    """(T, nkv, hd) with heads packed inside each row; rows may be strided."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.size(2)


if triton is not None:

    @triton.jit
    def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr, k_row_stride,
                         v_row_stride, ROW: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        loc = tl.load(loc_ptr + t).to(tl.int64)
        for start in tl.static_range(0, ROW, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < ROW
            k = tl.load(k_ptr + t * k_row_stride + cols, mask=mask)
            v = tl.load(v_ptr + t * v_row_stride + cols, mask=mask)
            tl.store(k_cache_ptr + loc * ROW + cols, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + loc * ROW + cols, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kernel_constants(row: int) -> dict[str, int]:
    """`_store_kv_kernel`'s compile-time arguments and launch options, for rows of `row` values
    (`bench resources` compiles the kernel with these too)."""
    return {"ROW": row, "BLOCK": min(triton.next_power_of_2(row), 4096), "num_warps": 4}


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """k_cache, v_cache: (locations, nkv, hd) contiguous; loc: (T,) int64; k, v: (T, nkv, hd) whose
    last two dims are packed (any row stride)."""
    T = loc.numel()
    if T == 0:
        return
    row = k_cache.size(1) * k_cache.size(2)
    assert packed(k) and packed(v), "k/v heads must be packed within a row"
    _store_kv_kernel[(T,)](k, v, k_cache, v_cache, loc, k.stride(0), v.stride(0),
                           **kernel_constants(row))
