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
(causal). Every key is in the pool: the piece before the call stored the step's own K/V.

A tile's keys grow with its depth into the sequence: at a 512-token prompt the last tile walks all
512 keys while the first walks 32, and where the tiles are fewer than the GPU holds at once the
step lasts as long as its longest walk. There `plan` cuts the long walks into shares of about the
average walk over `programs` programs (the spare ones past the tiles take the extra shares), each
share writes its part with its log-sum-exp, and the last share of a tile to finish (an atomic
count per tile and KV head) merges the parts into the output, as the decode kernel does
(small_decode.py). Where the tiles alone fill the GPU, splitting only adds the parts' traffic
(swept on an H200 and an H100, docs/benchmarks.md), so they walk whole. One kernel a layer
still. Share boundaries lie at or before the tile's first token, so every token sees a key of
every share.
`plan` refuses steps whose requests attend to more than `max_keys` keys, and those run the
attention between the pieces (FlashInfer) as before.

Shapes: q and out (T, nh, hd) (the bucket's rows; the tiles touch only the prefill rows); the KV
pool's pages (num_pages, P, nkv, hd), read as (num_pages * P, nkv, hd) at the token locations
`page_table[slot, :seq_len]` (int64, one per position). The work list of a bucket: (9, programs)
int64, one item a program: its tile's first row in q, token count (0: no work), request slot and
first token's position; its share's keys [first, end); the tile's first part (parts of a tile
are consecutive), the share's index among them and the tile's share count (1: unsplit, no
part). The parts' scratch: (MAX_PARTS, nkv, tile_rows, hd) float32 outputs and (MAX_PARTS, nkv,
tile_rows) log-sum-exps.
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

WORK_ROWS = 9  # the work list's columns (module docstring)
MAX_PARTS = 64  # split tiles' parts a step may write: the scratch's size (16 MiB: 8 x 128, 64 rows)


class PrefillShape(NamedTuple):
    """How the kernel is launched (`bench kernels --parts paged_prefill` sweeps these)."""

    block_n: int = 64  # keys per iteration
    warps: int = 4
    stages: int = 3  # Triton's software pipelining of the key loop's loads
    # Programs over all KV heads that the shares of long walks aim at, where the tiles are fewer:
    # about two resident per SM of an H200 (0: no tile split)
    programs: int = 256
    share_blocks: int = 4  # a share's keys: at least this many iterations
    # block_m * the group of query heads (padded to a power of two): the rows of one MMA operand
    tile_rows: int = 64
    # Walk the blocks of keys that every token of the tile sees (wholly at or before its first
    # token) in a loop of their own, without the causal mask's compare and select: 18-22 % less
    # device time at deep chunks on an H100 and 4-10 % at 512-token prompts, 0.2-0.6 us more at
    # a 128-token one (docs/benchmarks.md, "GPU, thirty-sixth round")
    free_blocks: bool = True


DEFAULT_SHAPE = PrefillShape()
# Tiles a bucket's grid has past one per `block_m` of its rows: a request's last tile is partial,
# so a step of more prefill requests than this may need more tiles than the grid holds (refused)
SPARE_TILES = 16

if triton is not None:
    from radixserve.engine.attention.small_decode import fold_key_block
    from radixserve.engine.pdl import wait_for_step_data

    # work_stride is the bucket's program count: one build for every bucket
    @triton.jit(do_not_specialize=["work_stride"])
    def _prefill_kernel(q_ptr, k_ptr, v_ptr, table_ptr, work_ptr, out_ptr, po_ptr, plse_ptr,
                        arrivals_ptr, sm_scale, work_stride, table_stride, q_stride_b,
                        q_stride_h, kv_stride_t, kv_stride_h, o_stride_b, o_stride_h,
                        NKV: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
                        HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        FREE_BLOCKS: tl.constexpr, PDL: tl.constexpr):
        item, kvh = tl.program_id(0), tl.program_id(1)
        wait_for_step_data(PDL)
        row0 = tl.load(work_ptr + item)
        n = tl.load(work_ptr + work_stride + item)
        slot = tl.load(work_ptr + 2 * work_stride + item)
        pos0 = tl.load(work_ptr + 3 * work_stride + item)
        k0 = tl.load(work_ptr + 4 * work_stride + item)
        k1 = tl.load(work_ptr + 5 * work_stride + item)  # an item without work: k1 = k0 = 0
        part0 = tl.load(work_ptr + 6 * work_stride + item)
        share = tl.load(work_ptr + 7 * work_stride + item)
        used = tl.load(work_ptr + 8 * work_stride + item)
        R: tl.constexpr = BLOCK_M * GROUP_P
        r = tl.arange(0, R)  # operand row: token r // GROUP_P, head r % GROUP_P
        tok, g = r // GROUP_P, r % GROUP_P
        live_q = (tok < n) & (g < GROUP)
        heads = kvh * GROUP + g
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + (row0 + tok)[:, None] * q_stride_b + heads[:, None] * q_stride_h
                    + d[None, :], mask=live_q[:, None], other=0.0)
        qpos = pos0 + tok  # each operand row's position in its sequence
        m = tl.full([R], float("-inf"), tl.float32)
        denom = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, HD], tl.float32)
        # k0 <= pos0 (plan): every token sees the share's first key, so no row's maximum stays -inf
        masked = k0
        if FREE_BLOCKS:  # whole blocks of keys at or before pos0: seen by every token
            masked = k0 + (tl.minimum(k1, pos0 + 1) - k0) // BLOCK_N * BLOCK_N
            every = tl.full([BLOCK_N], 1, tl.int1)
            for t in range(k0, masked, BLOCK_N):
                m, denom, acc = fold_key_block(q, m, denom, acc, table_ptr + slot * table_stride,
                                               t + tl.arange(0, BLOCK_N), every, every[None, :],
                                               k_ptr, v_ptr, kvh, kv_stride_t, kv_stride_h,
                                               sm_scale, HD)
        for t in range(masked, k1, BLOCK_N):
            offs = t + tl.arange(0, BLOCK_N)
            live = offs < k1
            seen = live[None, :] & (offs[None, :] <= qpos[:, None])  # causal
            m, denom, acc = fold_key_block(q, m, denom, acc, table_ptr + slot * table_stride, offs,
                                           live, seen, k_ptr, v_ptr, kvh, kv_stride_t,
                                           kv_stride_h, sm_scale, HD)
        out = (out_ptr + (row0 + tok)[:, None] * o_stride_b + heads[:, None] * o_stride_h
               + d[None, :])
        if used <= 1:  # the tile's whole walk (0: an item without work, nothing stored)
            o = acc / tl.maximum(denom, 1e-30)[:, None]
            tl.store(out, o.to(out_ptr.dtype.element_ty), mask=live_q[:, None])
        else:
            part = ((part0 + share) * NKV + kvh) * R + r  # (R,)
            tl.store(po_ptr + part[:, None] * HD + d[None, :], acc / denom[:, None])
            tl.store(plse_ptr + part, m + tl.log(denom))
            # Every thread's stores precede the one thread's release (the barrier), and the share
            # that arrives last sees every part (its acquire): it merges them and resets the
            # count for the next layer, which starts after this kernel has completed.
            tl.debug_barrier()
            arrival = tl.atomic_add(arrivals_ptr + part0 * NKV + kvh, 1, sem="acq_rel",
                                    scope="gpu")
            if arrival == used - 1:
                tl.store(arrivals_ptr + part0 * NKV + kvh, 0)
                m = tl.full([R], float("-inf"), tl.float32)
                denom = tl.zeros([R], tl.float32)
                acc = tl.zeros([R, HD], tl.float32)
                for s in range(0, used):  # parts written by other programs: through L2 (.cg)
                    part = ((part0 + s) * NKV + kvh) * R + r
                    lse = tl.load(plse_ptr + part, cache_modifier=".cg")
                    o = tl.load(po_ptr + part[:, None] * HD + d[None, :], cache_modifier=".cg")
                    m_new = tl.maximum(m, lse)
                    scale, w = tl.exp(m - m_new), tl.exp(lse - m_new)
                    acc = acc * scale[:, None] + w[:, None] * o
                    denom = denom * scale + w
                    m = m_new
                tl.store(out, (acc / denom[:, None]).to(out_ptr.dtype.element_ty),
                         mask=live_q[:, None])


def kernel_constants(num_heads: int, num_kv_heads: int, head_dim: int,
                     shape: PrefillShape) -> dict[str, int]:
    """`_prefill_kernel`'s compile-time arguments and launch options (PDL's apart:
    pdl.launch_kwargs). `bench resources` compiles the kernel with these too."""
    group = num_heads // num_kv_heads
    return {"NKV": num_kv_heads, "GROUP": group, "GROUP_P": triton.next_power_of_2(group),
            "HD": head_dim, "BLOCK_M": block_rows(num_heads, num_kv_heads, shape.tile_rows),
            "BLOCK_N": shape.block_n, "FREE_BLOCKS": shape.free_blocks, "num_warps": shape.warps,
            "num_stages": shape.stages}


def block_rows(num_heads: int, num_kv_heads: int, tile_rows: int = DEFAULT_SHAPE.tile_rows) -> int:
    """block_m: a tile's tokens, so that tokens x the padded group of query heads is `tile_rows`."""
    group = triton.next_power_of_2(num_heads // num_kv_heads)
    assert group <= tile_rows, f"groups of {group} query heads a KV head"
    return tile_rows // group


def programs_for(tokens: int, block_m: int, num_kv_heads: int,
                 shape: PrefillShape = DEFAULT_SHAPE) -> int:
    """The grid's programs per KV head for a bucket of `tokens` rows: a tile per `block_m` rows
    and SPARE_TILES, or the items the shares aim at where those are more (`share_keys` makes no
    more items than the tiles or the aim). No more: a program without work still costs its
    launch (2 us for 32 more a KV head, measured on an H100)."""
    return max(-(-tokens // block_m) + SPARE_TILES, shape.programs // num_kv_heads)


def _shares(first: int, end: int, keys: int) -> int:
    """Shares of `keys` keys for a tile whose first token is at `first` and whose keys end at
    `end`: the last share starts at or before `first` (and takes the rest)."""
    return min(-(-end // keys), first // keys + 1)


def share_keys(tiles: list[tuple[int, int]], aim: int, shape: PrefillShape) -> int:
    """Keys a share walks at most (0: every tile whole) for tiles of (first position, key end),
    where they are fewer than `aim` items (a KV head's share of `shape.programs`): the tiles'
    blocks of keys spread evenly over `aim` items, at least `share_blocks` blocks a share, and
    the split tiles' parts within MAX_PARTS."""
    if not tiles or aim <= len(tiles):
        return 0
    block = shape.block_n
    blocks = [-(-end // block) for _, end in tiles]
    longest, total = max(blocks), sum(blocks)
    per = max(shape.share_blocks, -(-total // aim))
    if per >= longest:
        return 0

    def fits(per: int) -> bool:
        keys, items, parts = per * block, 0, 0
        for first, end in tiles:
            u = _shares(first, end, keys)
            items += u
            parts += u if u > 1 else 0
        return items <= aim and parts <= MAX_PARTS

    if not fits(per):  # fewer, longer shares: the fewest that fit (bisected)
        lo, hi = per, longest  # fits(longest): every tile whole
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        per = hi
    return 0 if per >= longest else per * block


def work_list(first_row: int, prefill: StepLayout, block_m: int, aim: int = 0,
              shape: PrefillShape = DEFAULT_SHAPE) -> list[list[int]]:
    """The items of a step's prefill rows (their layout; its first new token is row `first_row`
    of the bucket), the work list's columns (module docstring): tiles of `block_m` tokens, their
    long walks split where they are fewer than `aim` (0: no tile split; `share_keys`). On the
    engine thread every step that plans it: plain loops and appends."""
    assert prefill.slot_list is not None, "the tiles need the slots on the host"
    spans = list(zip(prefill.slot_list, prefill.prefix_lens, prefill.seq_lens))
    keys = 0
    if aim:
        tiles = [(t, min(t + block_m, s)) for _, p, s in spans for t in range(p, s, block_m)]
        keys = share_keys(tiles, aim, shape)
    columns: list[list[int]] = [[] for _ in range(WORK_ROWS)]
    rows, counts, slots, starts, firsts, ends, parts, shares, useds = columns
    row = first_row
    part = 0
    for slot, p, s in spans:
        for t in range(p, s, block_m):
            n = min(block_m, s - t)
            end = t + n
            used = _shares(t, end, keys) if keys else 1
            rows += [row] * used
            counts += [n] * used
            slots += [slot] * used
            starts += [t] * used
            useds += [used] * used
            if used == 1:
                firsts.append(0)
                ends.append(end)
                parts.append(0)
                shares.append(0)
            else:
                firsts += range(0, used * keys, keys)
                ends += range(keys, used * keys, keys)
                ends.append(end)
                parts += [part] * used
                shares += range(used)
                part += used
            row += n
    return columns


class PagedPrefill:
    """The kernel's state for piecewise graphs: a work list per token bucket (rewritten by `plan`
    before a replay), at fixed addresses for the graphs that read them, and the split tiles'
    parts and arrival counts."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, sm_scale: float,
                 page_table: torch.Tensor, max_keys: int,
                 shape: PrefillShape = DEFAULT_SHAPE) -> None:
        assert num_heads % num_kv_heads == 0 and head_dim & (head_dim - 1) == 0
        self.num_kv_heads, self.shape = num_kv_heads, shape
        self._aim = shape.programs // num_kv_heads  # items a KV head's shares aim at
        self.sm_scale, self.page_table, self.max_keys = sm_scale, page_table, max_keys
        self.block_m = block_rows(num_heads, num_kv_heads, shape.tile_rows)
        self._constants = kernel_constants(num_heads, num_kv_heads, head_dim, shape)
        self._work: dict[int, torch.Tensor] = {}  # per bucket: (WORK_ROWS, programs_for(bucket))
        self._host = HostBuffers(page_table.device.type == "cuda")  # the plan's copy, one a step
        parts = MAX_PARTS * num_kv_heads * shape.tile_rows if self._aim else 1
        dev = page_table.device
        self._parts_o = torch.empty(parts, head_dim, dtype=torch.float32, device=dev)
        self._parts_lse = torch.empty(parts, dtype=torch.float32, device=dev)
        # per (split tile, KV head): its shares that have written their parts; the last one
        # merges and puts it back to 0
        self._arrivals = torch.zeros(MAX_PARTS * num_kv_heads, dtype=torch.int32, device=dev)

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
                WORK_ROWS, programs_for(tokens, self.block_m, self.num_kv_heads, self.shape),
                dtype=torch.int64, device=self.page_table.device)
        columns: list[list[int]] = [[] for _ in range(WORK_ROWS)]
        if prefill is not None:
            if max(prefill.seq_lens) > self.max_keys:
                return False
            columns = work_list(first_row, prefill, self.block_m, self._aim, self.shape)
            if len(columns[0]) > work.size(1):
                return False
        host = self._host.pack_rows(columns, work.size(1), (0,) * WORK_ROWS)
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
                q, k, v, table, work, out, self._parts_o, self._parts_lse, self._arrivals,
                self.sm_scale, work.size(1), table.stride(0), q.stride(0), q.stride(1),
                k.stride(1), k.stride(2), out.stride(0), out.stride(1),
                **constants, **pdl.launch_kwargs())

        return call
