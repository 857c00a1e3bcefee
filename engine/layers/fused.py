"""Triton kernels that fuse the element-wise chains around the matmuls (CUDA only).

A decode step of a small model is mostly launch-bound: eager RMSNorm is ~7 kernels, the Qwen3
q/k norms plus rotary ~30. Each kernel here does one chain in one pass, computing in float32 and
rounding where the reference layers round (after the normalisation, after SiLU), so results
match the reference layers to bf16 rounding. Callers fall back to the reference code on CPU.
"""

from __future__ import annotations

import torch
from radixserve.engine import pdl

try:
    import triton
    import triton.language as tl
    from radixserve.engine.pdl import wait_for_step_data
except ImportError:
    triton = None


def usable(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, x_stride, eps, D: tl.constexpr,
                         BLOCK: tl.constexpr, PDL: tl.constexpr):
        wait_for_step_data(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32) * w  # round as the reference does
        tl.store(out_ptr + row * D + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, x_stride, eps, D: tl.constexpr,
                             BLOCK: tl.constexpr, PDL: tl.constexpr):
        wait_for_step_data(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
        dt = out_ptr.dtype.element_ty
        s = (x + r).to(dt)  # the residual stream is rounded after each add, as in eager
        tl.store(r_ptr + row * D + cols, s, mask=mask)
        s32 = s.to(tl.float32)
        y = s32 * tl.rsqrt(tl.sum(s32 * s32, axis=0) / D + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * D + cols, (y.to(dt).to(tl.float32) * w).to(dt), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_out, k_out,
                             v_out, loc_ptr, qkv_stride, eps, NH: tl.constexpr, NKV: tl.constexpr,
                             HALF: tl.constexpr,
                             HP: tl.constexpr, VP: tl.constexpr, NORM: tl.constexpr,
                             STORE: tl.constexpr, PDL: tl.constexpr):
        """One token per program, all its heads at once: rows [0, NH) of the (HP, HALF) tiles are q
        heads, [NH, NH + NKV) k heads. STORE writes k and v straight into the paged KV cache.

        The position, its cos and sin, the norms' weights and the KV location are read before the
        wait for the kernels before this one: the step writes positions and locations before its
        first kernel launched with PDL (engine/pdl.py), and nothing writes the others."""
        t = tl.program_id(0)
        HD: tl.constexpr = 2 * HALF
        h = tl.arange(0, HP)[:, None]
        i = tl.arange(0, HALF)[None, :]
        is_qk, is_q = h < NH + NKV, h < NH
        dt = q_out.dtype.element_ty
        p = tl.load(pos_ptr + t).to(tl.int64)
        c1 = tl.load(cos_ptr + p * HD + i).to(dt).to(tl.float32)  # (1, HALF)
        c2 = tl.load(cos_ptr + p * HD + HALF + i).to(dt).to(tl.float32)
        s1 = tl.load(sin_ptr + p * HD + i).to(dt).to(tl.float32)
        s2 = tl.load(sin_ptr + p * HD + HALF + i).to(dt).to(tl.float32)
        if NORM:
            w1 = tl.where(is_q, tl.load(qw_ptr + i).to(tl.float32),
                          tl.load(kw_ptr + i).to(tl.float32))
            w2 = tl.where(is_q, tl.load(qw_ptr + HALF + i).to(tl.float32),
                          tl.load(kw_ptr + HALF + i).to(tl.float32))
        row = t
        if STORE:
            row = tl.load(loc_ptr + t).to(tl.int64)
        wait_for_step_data(PDL)
        base = qkv_ptr + t * qkv_stride + h * HD
        x1 = tl.load(base + i, mask=is_qk, other=0.0).to(tl.float32)  # (HP, HALF)
        x2 = tl.load(base + HALF + i, mask=is_qk, other=0.0).to(tl.float32)
        if NORM:
            r = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HD + eps)[:, None]
            x1 = ((x1 * r).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
            x2 = ((x2 * r).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        o1 = (x1 * c1 - x2 * s1).to(dt)  # rotate-half layout
        o2 = (x2 * c2 + x1 * s2).to(dt)
        q_dst = q_out + (t * NH + h) * HD
        tl.store(q_dst + i, o1, mask=is_q)
        tl.store(q_dst + HALF + i, o2, mask=is_q)
        is_k = is_qk & (h >= NH)
        k_dst = k_out + (row * NKV + h - NH) * HD
        kt = k_out.dtype.element_ty
        tl.store(k_dst + i, o1.to(kt), mask=is_k)
        tl.store(k_dst + HALF + i, o2.to(kt), mask=is_k)
        if STORE:  # v as it came out of the projection: a plain copy into the cache
            j = tl.arange(0, VP)
            v = tl.load(qkv_ptr + t * qkv_stride + (NH + NKV) * HD + j, mask=j < NKV * HD)
            tl.store(v_out + row * NKV * HD + j, v.to(v_out.dtype.element_ty), mask=j < NKV * HD)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, x_stride, I: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
        wait_for_step_data(PDL)
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < I
        g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * x_stride + I + cols, mask=mask, other=0.0).to(tl.float32)
        dt = out_ptr.dtype.element_ty
        s = (g * tl.sigmoid(g)).to(dt).to(tl.float32)  # SiLU rounds before the product, as in eager
        tl.store(out_ptr + row * I + cols, (s * u).to(dt), mask=mask)


# The kernels' compile-time arguments and launch options (PDL's apart: pdl.launch_kwargs), one
# function each; `bench resources` compiles the kernels with these too.
def norm_constants(D: int) -> dict[str, int]:
    """`_rms_norm_kernel`'s and `_add_rms_norm_kernel`'s, for rows of D values."""
    return {"D": D, "BLOCK": triton.next_power_of_2(D), "num_warps": 4 if D <= 2048 else 8}


def qk_norm_rope_constants(num_heads: int, num_kv_heads: int, head_dim: int, norm: bool,
                           store: bool) -> dict[str, int]:
    """`_qk_norm_rope_kernel`'s."""
    heads = triton.next_power_of_2(num_heads + num_kv_heads)
    return {"NH": num_heads, "NKV": num_kv_heads, "HALF": head_dim // 2, "HP": heads,
            "VP": triton.next_power_of_2(num_kv_heads * head_dim), "NORM": norm, "STORE": store,
            "num_warps": 4 if heads * head_dim <= 4096 else 8}


SILU_MUL_BLOCK = 1024  # features a program


def silu_mul_constants(I: int) -> dict[str, int]:
    """`_silu_mul_kernel`'s, for I features."""
    return {"I": I, "BLOCK": SILU_MUL_BLOCK, "num_warps": 4}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: (..., D) with the last dim packed; returns a contiguous (..., D)."""
    D = x.size(-1)
    rows = x.reshape(-1, D)  # a view when leading dims are uniform, else a copy
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.size(0):
        _rms_norm_kernel[(rows.size(0),)](rows, weight, out, rows.stride(0), eps,
                                          **norm_constants(D), **pdl.launch_kwargs())
    return out.view(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (in place), then RMSNorm of it; x (T, D) row-packed, residual (T, D)
    contiguous. Returns (normed, residual). One kernel for the add that closes a sublayer and the
    next norm."""
    T, D = x.shape
    out = torch.empty(T, D, dtype=x.dtype, device=x.device)
    if T:
        _add_rms_norm_kernel[(T,)](x, residual, weight, out, x.stride(0), eps, **norm_constants(D),
                                   **pdl.launch_kwargs())
    return out, residual


def qk_norm_rope(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                 num_heads: int, num_kv_heads: int, head_dim: int,
                 kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """From the fused projection qkv (T, (nh + 2 nkv) * hd), row-packed: per-head RMSNorm of q and k
    (when weights are given), then rotary. Returns q (T, nh, hd) and k (T, nkv, hd), contiguous; or,
    given kv_cache = (k_cache, v_cache, loc) with caches (locations, nkv, hd) and loc (T,) int64,
    writes k and v at loc (the KV store, in the same kernel) and returns (q, None)."""
    T = qkv.size(0)
    q = torch.empty(T, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if kv_cache is None:
        k_out = torch.empty(T, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
        v_out, loc = k_out, positions  # unused: STORE is off
    else:
        k_out, v_out, loc = kv_cache
    if T:
        norm = q_weight is not None and k_weight is not None
        _qk_norm_rope_kernel[(T,)](
            qkv, positions, cos, sin, q_weight if norm else qkv, k_weight if norm else qkv, q,
            k_out, v_out, loc, qkv.stride(0), eps,
            **qk_norm_rope_constants(num_heads, num_kv_heads, head_dim, norm,
                                     store=kv_cache is not None), **pdl.launch_kwargs())
    return q, (k_out if kv_cache is None else None)


def rope_supported(head_dim: int) -> bool:
    half = head_dim // 2
    return head_dim % 2 == 0 and half & (half - 1) == 0 and half >= 16


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: (N, 2I) = [gate | up] -> silu(gate) * up, (N, I)."""
    N, I = x.size(0), x.size(1) // 2
    out = torch.empty(N, I, dtype=x.dtype, device=x.device)
    if N:
        _silu_mul_kernel[(N, triton.cdiv(I, SILU_MUL_BLOCK))](
            x, out, x.stride(0), **silu_mul_constants(I), **pdl.launch_kwargs())
    return out
