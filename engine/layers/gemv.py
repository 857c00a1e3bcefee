"""Matrix-vector products for decode steps of a few rows (CUDA only).

At batch 1-4 a linear layer is a pure weight read. On the H200, cuBLAS reads small matrices with
fewer outputs than inputs (Qwen3-0.6B's o_proj 1024x2048, down_proj 1024x3072) at 0.3-0.8 TB/s
and the others at 1.5-3.2 TB/s, which this kernel does not beat (`radixserve bench kernels
--parts gemv`, table in docs/benchmarks.md). So it takes only matrices with N <= 2K outputs and
at most 16M weights. This kernel streams each weight row once: a program owns BLOCK_N
output features, reads their rows in BLOCK_K-wide slabs (contiguous, so loads coalesce) and keeps
one float32 accumulator per (input row, feature). Rounding happens once, at the store.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

MAX_ROWS = 4  # more rows than this and a tiled GEMM reads the weights no more often than we would
MAX_WEIGHT_ELEMENTS = 1 << 24  # larger matrices already stream near the bandwidth limit in cuBLAS
_TARGET_PROGRAMS = 264  # two per SM on an H100/H200: enough loads in flight to cover HBM latency


if triton is not None:

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, N, K, x_stride, out_stride, M: tl.constexpr,
                     MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.arange(0, MP)
        n_mask, m_mask = n < N, m < M
        acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < K
            w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            x = tl.load(x_ptr + m[:, None] * x_stride + k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                        other=0.0)
            acc += tl.sum(w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :], axis=2)  # (MP, BLOCK_N)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + m[:, None] * out_stride + n[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & n_mask[None, :])


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (triton is not None and x.is_cuda and x.dim() == 2 and 0 < x.size(0) <= MAX_ROWS
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and x.stride(-1) == 1 and weight.is_contiguous() and weight.numel() <= MAX_WEIGHT_ELEMENTS
            and weight.size(0) <= 2 * weight.size(1))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the GEMV kernel when x has few rows (decode at a small batch)."""
    if usable(x, weight):
        return gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def config(N: int, K: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps): enough programs to fill the GPU, at most 16K weights per slab."""
    block_k = min(triton.next_power_of_2(K), 1024)
    block_n = 16384 // block_k
    while block_n > 1 and triton.cdiv(N, block_n) < _TARGET_PROGRAMS:
        block_n //= 2
    return block_n, block_k, 8 if block_n * block_k >= 8192 else 4


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         blocks: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x (M, K), weight (N, K), bias (N,) -> x @ weight.T + bias, (M, N) in x's dtype; M <= MAX_ROWS."""
    M, K = x.shape
    N = weight.size(0)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    block_n, block_k, warps = blocks or config(N, K)
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, bias if bias is not None else weight, out, N, K, x.stride(0), out.stride(0), M=M,
        MP=triton.next_power_of_2(M), BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None,
        num_warps=warps)
    return out
