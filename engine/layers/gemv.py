"""Matrix-vector products for decode steps of a few rows (CUDA only), optionally with the
element-wise ops that produce their input, or that take their output, folded in.

At batch 1-4 a linear layer is a pure weight read. On the H200, cuBLAS reads small matrices with
fewer outputs than inputs (Qwen3-0.6B's o_proj 1024x2048, down_proj 1024x3072) at 0.3-0.8 TB/s
and the others at 2.8-4.0 TB/s (`radixserve bench kernels --parts gemv`, tables in
docs/benchmarks.md). This kernel streams each weight row once: it cuts the outputs into blocks of
BLOCK_N features, reads their rows in BLOCK_K-wide slabs (contiguous, so loads coalesce) and keeps
one float32 accumulator per (input row, feature). Rounding happens once, at the store. Where K >=
2048 a slab spans 2,048-4,096 columns (whole rows up to K = 4,096; 16K weights) and is loaded with
an evict-first hint: more bytes in flight per program, and the L2 left to the inputs. There at
most two programs per SM share out the blocks, each loading its next slab while it reduces the
last: a program's weight stream never waits for a reduction, a store or a new program's start
(docs/benchmarks.md, "GPU, thirteenth round"). It takes
- matrices with N <= 2K outputs and at most 16M weights, at 1-4 rows (the small model's o_proj and
  down_proj: 1.2-3x faster than cuBLAS);
- any matrix with K >= 2048 at one row (the 8B model's projections and lm_head).
  At 2 rows it only matches cuBLAS there, and at 4 it loses.

A decode step is a chain of few-microsecond kernels, so the ops next to the product are worth
folding in where it runs here anyway:
- `normed`: the input is RMSNorm(x + residual) (the qkv and gate_up projections); every program
  computes the norm of its rows (a few KiB, from L2; once for all its blocks where a slab is a
  whole row) and program 0 writes the new residual;
- `swiglu`: the output is silu(gate) * up of a fused [gate | up] projection; each block of
  outputs holds the gate and up rows of the same features, so its store applies it;
- `gated`: the input is silu(gate) * up (the MLP's down_proj, at 3-4 rows where gate_up is
  cuBLAS's); every block computes it over all inputs again, so it is kept to small matrices.
All round where the unfused layers round, so results match them to bf16 rounding.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from radixserve.engine import pdl

try:
    import triton
    import triton.language as tl
    from radixserve.engine.pdl import wait_for_step_data
except ImportError:
    triton = None

MAX_ROWS = 4  # more rows than this and a tiled GEMM reads the weights no more often than we would
# the normed product re-reads its input per program; past 2 rows cuBLAS + a norm wins
MAX_NORMED_ROWS = 2
MAX_WEIGHT_ELEMENTS = 1 << 24  # larger matrices already stream near the bandwidth limit in cuBLAS
# Below WIDE_K: enough programs that every SM has several slabs in flight.
_TARGET_PROGRAMS = 2048
WIDE_K = 2048  # from here on, slabs of whole rows

PLAIN, GATED, NORMED = 0, 1, 2  # what the kernel's input is: x, silu(gate) * up, rms_norm(x [+ r])


if triton is not None:

    @triton.jit
    def _weights(w_ptr, n, n_mask, k, K, STREAM: tl.constexpr):
        """One slab of weight rows, (BLOCK_N, BLOCK_K)."""
        w_mask = n_mask[:, None] & (k < K)[None, :]
        if STREAM:  # read once: keep L2 for the inputs and the next kernel's data
            return tl.load(w_ptr + n[:, None] * K + k[None, :], mask=w_mask, other=0.0,
                           eviction_policy="evict_first")
        return tl.load(w_ptr + n[:, None] * K + k[None, :], mask=w_mask, other=0.0)

    @triton.jit
    def _inputs(x_rows, r_ptr, nw_ptr, out_ptr, m, m_mask, k, K, scale, INPUT: tl.constexpr,
                HAS_RES: tl.constexpr):
        """The product's input over one slab of columns, (MP, BLOCK_K) float32. scale (MP, 1):
        the rows' RMS scale (INPUT 2)."""
        dt = out_ptr.dtype.element_ty
        k_mask = k < K
        mk = m_mask[:, None] & k_mask[None, :]
        if INPUT == 1:  # [gate | up] rows: SiLU rounds before the product, as in eager
            g = tl.load(x_rows + k[None, :], mask=mk, other=0.0).to(tl.float32)
            u = tl.load(x_rows + K + k[None, :], mask=mk, other=0.0).to(tl.float32)
            x = ((g * tl.sigmoid(g)).to(dt).to(tl.float32) * u).to(dt).to(tl.float32)
        elif INPUT == 2:
            h = tl.load(x_rows + k[None, :], mask=mk, other=0.0)
            if HAS_RES:
                h = (h.to(tl.float32) + tl.load(r_ptr + m[:, None] * K + k[None, :], mask=mk,
                                                other=0.0).to(tl.float32)).to(dt)
            nw = tl.load(nw_ptr + k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
            x = ((h.to(tl.float32) * scale).to(dt).to(tl.float32) * nw).to(dt).to(tl.float32)
        else:
            x = tl.load(x_rows + k[None, :], mask=mk, other=0.0).to(tl.float32)
        return x

    @triton.jit
    def _rows(blk, N, BLOCK_N: tl.constexpr, SWIGLU: tl.constexpr):
        """Block blk's weight rows, (BLOCK_N,), and their mask. With SWIGLU the N rows are
        [gate | up] and the block holds features j of both halves, interleaved: rows j and
        N // 2 + j side by side, for BLOCK_N // 2 features."""
        i = tl.arange(0, BLOCK_N)
        if SWIGLU:
            j = blk * (BLOCK_N // 2) + i // 2
            return j + (i % 2) * (N // 2), j < N // 2
        n = blk * BLOCK_N + i
        return n, n < N

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, r_ptr, r_out_ptr, nw_ptr, eps, N, K, x_stride,
                     out_stride, M: tl.constexpr, MP: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr,
                     HAS_BIAS: tl.constexpr, INPUT: tl.constexpr, HAS_RES: tl.constexpr,
                     STREAM: tl.constexpr, WALK: tl.constexpr, ONE_SLAB: tl.constexpr,
                     SWIGLU: tl.constexpr, PDL: tl.constexpr):
        """Without WALK, program p computes the block of outputs p. With it, program p of P owns
        blocks p, p + P, p + 2P, ... and walks their (block, slab) tiles in order, loading each
        tile's weights while it reduces the one before: the weight stream never stops for a
        reduction, a store or a new program. ONE_SLAB (BLOCK_K >= K): every tile's input is the
        whole row, computed once."""
        pid = tl.program_id(0)
        m = tl.arange(0, MP)
        m_mask = m < M
        dt = out_ptr.dtype.element_ty
        x_rows = x_ptr + m[:, None] * x_stride
        # The first tile's weights are read before the wait for the kernels before this one (no
        # kernel of a step writes weights): with PDL they stream in while those finish.
        n, n_mask = _rows(pid, N, BLOCK_N, SWIGLU)
        k = tl.arange(0, BLOCK_K)
        w = _weights(w_ptr, n, n_mask, k, K, STREAM)
        wait_for_step_data(PDL)
        scale = tl.full((MP, 1), 1.0, tl.float32)
        if INPUT == 2:  # first pass: the rows' mean square (and the new residual, by program 0)
            ss = tl.zeros((MP,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                mk = m_mask[:, None] & (kk < K)[None, :]
                h = tl.load(x_rows + kk[None, :], mask=mk, other=0.0)
                if HAS_RES:  # the residual stream is rounded after each add, as in eager
                    h = (h.to(tl.float32) + tl.load(r_ptr + m[:, None] * K + kk[None, :],
                                                    mask=mk, other=0.0).to(tl.float32)).to(dt)
                    if pid == 0:
                        tl.store(r_out_ptr + m[:, None] * K + kk[None, :], h, mask=mk)
                h = h.to(tl.float32)
                ss += tl.sum(h * h, axis=1)
            scale = tl.rsqrt(ss / K + eps)[:, None]  # (MP, 1)
        x = _inputs(x_rows, r_ptr, nw_ptr, out_ptr, m, m_mask, k, K, scale, INPUT, HAS_RES)
        if not WALK:  # one block per program: its slabs in turn
            acc = tl.sum(w.to(tl.float32)[None, :, :] * x[:, None, :], axis=2)  # (MP, BLOCK_N)
            for k0 in range(BLOCK_K, K, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                w = _weights(w_ptr, n, n_mask, k, K, STREAM)
                x = _inputs(x_rows, r_ptr, nw_ptr, out_ptr, m, m_mask, k, K, scale, INPUT,
                            HAS_RES)
                acc += tl.sum(w.to(tl.float32)[None, :, :] * x[:, None, :], axis=2)
            _store(out_ptr, b_ptr, acc, pid, N, m, m_mask, out_stride, MP, BLOCK_N, HAS_BIAS,
                   SWIGLU)
        else:
            programs = tl.num_programs(0)
            slabs = tl.cdiv(K, BLOCK_K)
            if SWIGLU:
                blocks = tl.cdiv(N // 2, BLOCK_N // 2)
            else:
                blocks = tl.cdiv(N, BLOCK_N)
            tiles = tl.cdiv(blocks - pid, programs) * slabs  # this program's
            acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
            for t in range(0, tiles):
                # the next tile's weights first; past the last tile its block is past the last
                # block, so the mask reads nothing
                nxt = t + 1
                n_next, next_mask = _rows(pid + (nxt // slabs) * programs, N, BLOCK_N, SWIGLU)
                k_next = (nxt % slabs) * BLOCK_K + tl.arange(0, BLOCK_K)
                w_next = _weights(w_ptr, n_next, next_mask, k_next, K, STREAM)
                s = t % slabs
                if not ONE_SLAB:
                    k = s * BLOCK_K + tl.arange(0, BLOCK_K)
                    x = _inputs(x_rows, r_ptr, nw_ptr, out_ptr, m, m_mask, k, K, scale, INPUT,
                                HAS_RES)
                acc += tl.sum(w.to(tl.float32)[None, :, :] * x[:, None, :], axis=2)
                if s == slabs - 1:
                    _store(out_ptr, b_ptr, acc, pid + (t // slabs) * programs, N, m, m_mask,
                           out_stride, MP, BLOCK_N, HAS_BIAS, SWIGLU)
                    acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
                w = w_next

    @triton.jit
    def _store(out_ptr, b_ptr, acc, blk, N, m, m_mask, out_stride, MP: tl.constexpr,
               BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr):
        """Block blk's outputs from acc (MP, BLOCK_N) float32, plus the bias, rounded once; with
        SWIGLU, silu(gate) * up of its (gate, up) pairs, (MP, BLOCK_N // 2), rounded where the
        unfused projection and SiLU-mul round."""
        n, n_mask = _rows(blk, N, BLOCK_N, SWIGLU)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        dt = out_ptr.dtype.element_ty
        if SWIGLU:
            g, u = tl.split(tl.reshape(acc, (MP, BLOCK_N // 2, 2)))
            g = g.to(dt).to(tl.float32)
            y = (g * tl.sigmoid(g)).to(dt).to(tl.float32) * u.to(dt).to(tl.float32)
            j = blk * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            tl.store(out_ptr + m[:, None] * out_stride + j[None, :], y.to(dt),
                     mask=m_mask[:, None] & (j < N // 2)[None, :])
        else:
            tl.store(out_ptr + m[:, None] * out_stride + n[None, :], acc.to(dt),
                     mask=m_mask[:, None] & n_mask[None, :])


def _kernel_ok(x: torch.Tensor, weight: torch.Tensor, max_rows: int,
               max_weights: int = MAX_WEIGHT_ELEMENTS) -> bool:
    return (triton is not None and x.is_cuda and x.dim() == 2 and 0 < x.size(0) <= max_rows
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and x.stride(-1) == 1 and weight.is_contiguous()
            and weight.numel() <= max_weights)


def _small_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return _kernel_ok(x, weight, MAX_ROWS) and weight.size(0) <= 2 * weight.size(1)


def _wide_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One row and K >= WIDE_K, any size whose offsets stay within int32."""
    return _kernel_ok(x, weight, 1, max_weights=(1 << 31) - 1) and weight.size(1) >= WIDE_K


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The plain product beats cuBLAS here: few rows and a small matrix with N <= 2K, or one row
    and K >= WIDE_K."""
    return _small_ok(x, weight) or _wide_ok(x, weight)


def gated_usable(gate_up: torch.Tensor, weight: torch.Tensor) -> bool:
    """Small matrices only: on a wide one every block of outputs would compute SiLU-mul over the
    whole input again (Qwen3-8B's down_proj: 3.6 us a layer slower than its own kernel first)."""
    return _small_ok(gate_up, weight) and gate_up.size(1) == 2 * weight.size(1)


def normed_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Worth fusing even where the plain product only matches cuBLAS: it saves the norm's launch.
    Small matrices at 1-2 rows, and wide ones (K >= WIDE_K) at one row: there each program
    normalizes the row once and keeps it for all its blocks."""
    return ((_kernel_ok(x, weight, MAX_NORMED_ROWS) or _wide_ok(x, weight))
            and x.size(1) == weight.size(1))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the GEMV kernel when x has few rows (decode at a small batch)."""
    if usable(x, weight):
        return gemv(x, weight, bias)
    return F.linear(x, weight, bias)


class Blocks(NamedTuple):
    """A launch shape: a program reads `block_n` outputs' rows `block_k` weights at a time;
    `stream` loads the weights with an evict-first hint (each is read once). `per_sm` > 0
    launches that many programs per SM, each looping over several blocks of outputs; 0 launches
    one program per block."""

    block_n: int
    block_k: int
    warps: int
    stream: bool = False
    per_sm: int = 0


def config(N: int, K: int) -> Blocks:
    """16K weights per slab: whole rows where K >= WIDE_K, two programs per SM (the best of the
    H200 sweeps, alone and chained as in a decode step), else 1,024-wide slabs and enough programs
    to fill the GPU."""
    if K >= WIDE_K:
        block_k = min(triton.next_power_of_2(K), 4096)
        return Blocks(16384 // block_k, block_k, 8, stream=True, per_sm=2)
    block_k = min(triton.next_power_of_2(K), 1024)
    block_n = 16384 // block_k
    while block_n > 1 and triton.cdiv(N, block_n) < _TARGET_PROGRAMS:
        block_n //= 2
    return Blocks(block_n, block_k, 8 if block_n * block_k >= 8192 else 4)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         blocks: Blocks | None = None, swiglu: bool = False) -> torch.Tensor:
    """x (M, K), weight (N, K), bias (N,) -> y = x @ weight.T + bias, (M, N) in x's dtype; with
    swiglu, silu(y[:, :N/2]) * y[:, N/2:], (M, N/2): weight is a fused [gate | up].

    M <= MAX_ROWS."""
    return _launch(PLAIN, x, weight, bias, blocks, swiglu=swiglu)[0]


def gated_gemv(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               blocks: Blocks | None = None) -> torch.Tensor:
    """gate_up (M, 2K) = [gate | up], weight (N, K) -> (silu(gate) * up) @ weight.T + bias.

    Returns (M, N)."""
    return _launch(GATED, gate_up, weight, bias, blocks)[0]


def normed_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                eps: float, weight: torch.Tensor, bias: torch.Tensor | None = None,
                blocks: Blocks | None = None,
                swiglu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) row-packed, residual (M, K) contiguous or None -> (rms_norm(s) @ weight.T + bias, s)
    with s = x + residual (a new tensor; the residual is not written) or s = x without one; swiglu
    as in `gemv`."""
    y, s = _launch(NORMED, x, weight, bias, blocks, residual, norm_weight, eps, swiglu)
    assert s is not None
    return y, s


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere: Triton's interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def kernel_constants(input: int, M: int, N: int, K: int, blocks: Blocks, *, has_bias: bool,
                     has_residual: bool, swiglu: bool, sm_count: int) -> tuple[int, dict[str, Any]]:
    """A launch's programs, and `_gemv_kernel`'s compile-time arguments and launch options for it
    (PDL's apart: pdl.launch_kwargs). `bench resources` compiles the kernel with these too."""
    block_n, block_k, warps, stream, per_sm = blocks
    if swiglu:  # a block holds (gate, up) pairs of rows
        block_n = max(block_n, 2)
    blocks_n = triton.cdiv(N // 2, block_n // 2) if swiglu else triton.cdiv(N, block_n)
    programs = min(blocks_n, per_sm * sm_count) if per_sm else blocks_n
    return programs, {
        "M": M, "MP": triton.next_power_of_2(M), "BLOCK_N": block_n, "BLOCK_K": block_k,
        "HAS_BIAS": has_bias, "INPUT": input, "HAS_RES": has_residual, "STREAM": stream,
        "WALK": programs < blocks_n,  # else each program has one block: the straight-line code
        "ONE_SLAB": block_k >= K, "SWIGLU": swiglu, "num_warps": warps}


def _launch(input: int, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            blocks: Blocks | None, residual: torch.Tensor | None = None,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0,
            swiglu: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    M = x.size(0)
    N, K = weight.shape
    if swiglu and N % 2:
        raise ValueError(f"a [gate | up] weight has an even number of rows, not {N}")
    out = torch.empty(M, N // 2 if swiglu else N, dtype=x.dtype, device=x.device)
    r_out = None
    if input == NORMED:
        r_out = torch.empty(M, K, dtype=x.dtype, device=x.device) if residual is not None else x
    programs, constants = kernel_constants(
        input, M, N, K, blocks or config(N, K), has_bias=bias is not None,
        has_residual=residual is not None, swiglu=swiglu, sm_count=_sm_count(x.device))
    _gemv_kernel[(programs,)](
        x, weight, bias if bias is not None else weight, out,
        residual if residual is not None else x,
        r_out if r_out is not None else out, norm_weight if norm_weight is not None else weight,
        eps, N, K, x.stride(0), out.stride(0), **constants, **pdl.launch_kwargs())
    return out, r_out
