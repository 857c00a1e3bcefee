"""Prefill attention over the paged KV pool in Triton, planned by a work list on the device, so
that it can be captured in the piecewise graphs (piecewise_graph.py) beside the decode call.

A step that admits a prompt beside running streams replays the piecewise graphs with each layer's
prefill attention called eagerly between two pieces: per layer a graph replay and a kernel call
from Python, 57 host calls a step on Qwen3-0.6B, and on a busy host each one costs tens of
microseconds that every running stream waits for. FlashInfer's prefill kernels take their launch
shape from a host plan of each step's lengths, so a graph captured for one step cannot run
another. Here the launch shape is the bucket's: a fixed grid of tiles x KV heads, and each tile's
work (which rows, which request, from which position) is read from a list that `plan` copies to
the device before the replay. A tile with no work ends at once. With the decode rows attended by
the decode call (attention/small_decode.py), every row of the step is then attended inside the
graph, and the whole forward is one replay.

A tile is up to `block_m` consecutive new tokens of one request and the query heads of one KV head,
a (block_m * group, head_dim) operand of the tensor cores; it walks the request's keys from
position 0 to its last token, in pages through the page table, masking the keys past each token
(causal). Every key is in the pool: the piece before the call stored the step's own K/V. Rows are
not split over programs, so a tile deep into a long context walks all of it alone: `plan` refuses
steps whose requests attend to more than `max_keys` keys, and those run the attention between the
pieces (FlashInfer) as before.

Shapes: q and out (T, nh, hd) (the bucket's rows; the tiles touch only the prefill rows); the KV
pool's pages (num_pages, P, nkv, hd), read as (num_pages * P, nkv, hd) at the token locations
`page_table[slot, :seq_len]` (int64, one per position). The work list of a bucket: (4, tiles)
int64: each tile's first row in q, its token count (0: no work), its request's slot and the
position of its first token.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from radixserve.engine import pdl
from radixserve.engine.attention.base import LayerCall, StepLayout
from radixserve.engine.host_buffers import HostBuffers

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

TILE_ROWS = 64  # block_m * the group of query heads (padded to a power of two): one MMA operand


class PrefillShape(NamedTuple):
    """How the kernel is launched (`bench kernels --parts paged_prefill` sweeps these)."""

    block_n: int = 64  # keys per iteration
    warps: int = 4
    stages: int = 2  # Triton's software pipelining of the key loop's loads


DEFAULT_SHAPE = PrefillShape()
# Tiles a bucket's grid has past one per `block_m` of its rows: a request's last tile is partial,
# so a step of more prefill requests than this may need more tiles than the grid holds (refused)
SPARE_TILES = 16

if triton is not None:
    from radixserve.engine.attention.small_decode import fold_key_block
    from radixserve.engine.pdl import wait_for_step_data

    # work_stride is the bucket's tile count: one build for every bucket
    @triton.jit(do_not_specialize=["work_stride"])
    def _prefill_kernel(q_ptr, k_ptr, v_ptr, table_ptr, work_ptr, out_ptr, sm_scale, work_stride,
                        table_stride, q_stride_b, q_stride_h, kv_stride_t, kv_stride_h,
                        o_stride_b, o_stride_h, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
                        HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        PDL: tl.constexpr):
        tile, kvh = tl.program_id(0), tl.program_id(1)
        wait_for_step_data(PDL)
        row0 = tl.load(work_ptr + tile)
        n = tl.load(work_ptr + work_stride + tile)
        slot = tl.load(work_ptr + 2 * work_stride + tile)
        pos0 = tl.load(work_ptr + 3 * work_stride + tile)
        r = tl.arange(0, BLOCK_M * GROUP_P)  # operand row: token r // GROUP_P, head r % GROUP_P
        tok, g = r // GROUP_P, r % GROUP_P
        live_q = (tok < n) & (g < GROUP)
        heads = kvh * GROUP + g
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + (row0 + tok)[:, None] * q_stride_b + heads[:, None] * q_stride_h
                    + d[None, :], mask=live_q[:, None], other=0.0)
        qpos = pos0 + tok  # each operand row's position in its sequence
        end = tl.where(n > 0, pos0 + n, 0)  # keys [0, end); a tile without work walks none
        m = tl.full([BLOCK_M * GROUP_P], float("-inf"), tl.float32)
        denom = tl.zeros([BLOCK_M * GROUP_P], tl.float32)
        acc = tl.zeros([BLOCK_M * GROUP_P, HD], tl.float32)
        # key 0 is in the first block and every token sees it, so no row's maximum stays -inf
        for t in range(0, end, BLOCK_N):
            offs = t + tl.arange(0, BLOCK_N)
            live = offs < end
            seen = live[None, :] & (offs[None, :] <= qpos[:, None])  # causal
            m, denom, acc = fold_key_block(q, m, denom, acc, table_ptr + slot * table_stride, offs,
                                           live, seen, k_ptr, v_ptr, kvh, kv_stride_t,
                                           kv_stride_h, sm_scale, HD)
        o = acc / tl.maximum(denom, 1e-30)[:, None]
        tl.store(out_ptr + (row0 + tok)[:, None] * o_stride_b + heads[:, None] * o_stride_h
                 + d[None, :], o.to(out_ptr.dtype.element_ty), mask=live_q[:, None])


def kernel_constants(num_heads: int, num_kv_heads: int, head_dim: int,
                     shape: PrefillShape) -> dict[str, int]:
    """`_prefill_kernel`'s compile-time arguments and launch options (PDL's apart:
    pdl.launch_kwargs). `bench resources` compiles the kernel with these too."""
    group = num_heads // num_kv_heads
    return {"GROUP": group, "GROUP_P": triton.next_power_of_2(group), "HD": head_dim,
            "BLOCK_M": block_rows(num_heads, num_kv_heads), "BLOCK_N": shape.block_n,
            "num_warps": shape.warps, "num_stages": shape.stages}


def block_rows(num_heads: int, num_kv_heads: int) -> int:
    """block_m: a tile's tokens, so that tokens x the padded group of query heads is TILE_ROWS."""
    group = triton.next_power_of_2(num_heads // num_kv_heads)
    assert group <= TILE_ROWS, f"groups of {group} query heads a KV head"
    return TILE_ROWS // group


def tiles_for(tokens: int, block_m: int) -> int:
    """The grid's tiles for a bucket of `tokens` rows."""
    return -(-tokens // block_m) + SPARE_TILES


def work_list(first_row: int, prefill: StepLayout, block_m: int) -> list[list[int]]:
    """The tiles of a step's prefill rows (their layout; its first new token is row `first_row`
    of the bucket): [first rows, token counts, slots, first positions]."""
    assert prefill.slot_list is not None, "the tiles need the slots on the host"
    rows: list[int] = []
    counts: list[int] = []
    slots: list[int] = []
    starts: list[int] = []
    row = first_row
    for slot, p, s in zip(prefill.slot_list, prefill.prefix_lens, prefill.seq_lens):
        for t in range(p, s, block_m):
            n = min(block_m, s - t)
            rows.append(row)
            counts.append(n)
            slots.append(slot)
            starts.append(t)
            row += n
    return [rows, counts, slots, starts]


class PagedPrefill:
    """The kernel's state for piecewise graphs: a work list per token bucket (rewritten by `plan`
    before a replay), at fixed addresses for the graphs that read them."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, sm_scale: float,
                 page_table: torch.Tensor, max_keys: int,
                 shape: PrefillShape = DEFAULT_SHAPE) -> None:
        assert num_heads % num_kv_heads == 0 and head_dim & (head_dim - 1) == 0
        self.num_kv_heads = num_kv_heads
        self.sm_scale, self.page_table, self.max_keys = sm_scale, page_table, max_keys
        self.block_m = block_rows(num_heads, num_kv_heads)
        self._constants = kernel_constants(num_heads, num_kv_heads, head_dim, shape)
        self._work: dict[int, torch.Tensor] = {}  # per bucket: (4, tiles_for(bucket))
        self._host = HostBuffers(page_table.device.type == "cuda")  # the plan's copy, one a step

    @staticmethod
    def usable(device: torch.device, head_dim: int) -> bool:
        # head dims as the small decode kernel's (64 by the interpreter, 128 on an H200)
        return triton is not None and device.type == "cuda" and head_dim in (64, 128)

    def plan(self, tokens: int, first_row: int, prefill: StepLayout | None) -> bool:
        """Write the work list of bucket `tokens` for a step's prefill rows (None: no work, the
        placeholder a capture runs). False, and nothing written, where the step does not fit:
        more tiles than the grid, or a request that attends to more than `max_keys` keys."""
        work = self._work.get(tokens)
        if work is None:  # before its capture: every later plan writes into this one
            work = self._work[tokens] = torch.zeros(
                4, tiles_for(tokens, self.block_m), dtype=torch.int64,
                device=self.page_table.device)
        columns: list[list[int]] = [[], [], [], []]
        if prefill is not None:
            if max(prefill.seq_lens) > self.max_keys:
                return False
            columns = work_list(first_row, prefill, self.block_m)
            if len(columns[0]) > work.size(1):
                return False
        host = self._host.pack_rows(columns, work.size(1), (0, 0, 0, 0))
        work.copy_(host, non_blocking=True)
        return True

    def bind(self, tokens: int) -> LayerCall:
        """The call that runs one layer of bucket `tokens`' latest plan (`plan` it first)."""
        work = self._work[tokens]
        table, constants = self.page_table, self._constants
        grid = (work.size(1), self.num_kv_heads)

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
            # k, v: (num_pages, P, nkv, hd), token-major within a page and pages back to back
            # (runs when a graph is captured, not when it replays)
            assert k.stride(0) == k.size(1) * k.stride(1) and v.stride() == k.stride()
            _prefill_kernel[grid](
                q, k, v, table, work, out, self.sm_scale, work.size(1), table.stride(0),
                q.stride(0), q.stride(1), k.stride(1), k.stride(2), out.stride(0), out.stride(1),
                **constants, **pdl.launch_kwargs())

        return call
