"""Paged decode attention for the decode CUDA graphs (up to `small_decode_rows` rows, 256 by
default), in Triton, planned by the rows' lengths alone.

At one row FlashInfer's decode kernel leaves most of a Hopper GPU idle: Qwen3-0.6B has 8 KV
heads, so a row is 8 programs unless the KV is split, and in CUDA graph mode FlashInfer always
splits (chunks of at least 128 keys) and then merges in a second kernel, with a host plan before
every replay. Here a row's keys are cut into tiles of BLOCK_N tokens and the tiles shared out among
programs per KV head. A row whose tiles fit one program writes its output directly; otherwise each
program writes its part with its log-sum-exp, and the last of them to finish (an atomic count per
row and KV head) combines the parts of its group's heads. One kernel a layer: a second one to
merge would cost a launch and its wait in every layer of a step that is a chain of short kernels.

How the shares are decided depends on the graph's width (its `LaunchShape`):
- narrow graphs (up to 32 rows): up to `splits` programs per row and KV head, the shares decided
  on the device from the row's length, so a graph reads only what the step already holds: each
  row's slot and length, and the page table;
- wide graphs: one program per row and KV head takes the whole row, or its first share where
  the row is longer than `long_tiles` tiles; the other shares of such long rows go to `spare`
  programs per KV head through a work list that `plan` writes before the replay (the host knows
  the lengths). A grid with room for every row's shares would launch mostly idle programs, and
  a row of 16k keys walked by one program sets the whole step's length.

Shapes: q (B, nh, hd); the KV pool's pages (num_pages, P, nkv, hd), read as (num_pages * P, nkv,
hd) at the token locations `page_table[slot, :seq_len]` (int64, one per position); out (B, nh, hd).
The kernel takes part in programmatic dependent launch (engine/pdl.py).

It began as the kernel of graphs of a few rows, hence its name. At 64 rows and more it still
beats FlashInfer's decode kernel as the engine plans it (CUDA cores): Qwen3-8B ran the offline
workload 21 % faster, Qwen3-0.6B 5 %. The likely reason, not profiled: this kernel takes a KV
head's whole group of query heads as one tensor-core tile, and Qwen3-8B's groups are of 4.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from radixserve.engine import pdl
from radixserve.engine.attention.base import LayerCall
from radixserve.engine.host_buffers import HostBuffers

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


class LaunchShape(NamedTuple):
    """How the kernel is launched (`bench kernels --parts small_decode` sweeps these)."""

    block_n: int = 64  # keys per tile: one program's smallest share of a row
    programs: int = 512  # programs aimed at in all: about four per SM of an H200
    warps: int = 4
    stages: int = 3  # Triton's software pipelining of the key loop's loads (its default)
    # Listed shares (0: shares decided on the device): programs per KV head past the rows', for
    # the shares of rows of more than `long_tiles` tiles, as `plan` lists them; a share is at
    # least `share_tiles` tiles
    spare: int = 0
    long_tiles: int = 16
    share_tiles: int = 4


# Graphs of up to 32 rows: the best, or within 1 us of it, of six swept on an H200 at 1-32 rows
# and 128-8,192 keys. Wider graphs take tiles of 128 keys: with ragged rows, as a served batch has
# them, fewer and longer loads per program end the long rows sooner (docs/benchmarks.md). Their
# rows stay whole up to 2,048 keys (16 tiles), as every row of the offline workload: splitting
# rows past 512 keys cost it 5 %. Longer rows share out over 64 spare programs per KV head.
DEFAULT_SHAPE = LaunchShape()
WIDE_ROWS = 32
WIDE_SHAPE = LaunchShape(block_n=128, spare=64, long_tiles=16, share_tiles=4)
MAX_SPLITS = 64
MERGE_CHUNK = 8  # parts the merging program reads at a time, per head


def shape_for(rows: int) -> LaunchShape:
    return DEFAULT_SHAPE if rows <= WIDE_ROWS else WIDE_SHAPE


if triton is not None:
    from radixserve.engine.pdl import wait_for_step_data

    @triton.jit
    def _merge_group(out_ptr, po_ptr, plse_ptr, b, kvh, used, part0, s_stride, h_stride,
                     o_stride_b, o_stride_h, GROUP: tl.constexpr, HD: tl.constexpr,
                     CHUNK: tl.constexpr):
        """Combine the `used` parts of each head of KV head kvh's group into row b's output, all
        heads at once and CHUNK parts at a time: a tile of (heads x CHUNK, HD), so the merge adds
        no more registers than the key loop holds. Head g's part s is at part0 + s * s_stride +
        g * h_stride. The parts were written by other programs: read through L2 (.cg), never a
        stale L1."""
        GROUP2: tl.constexpr = triton.next_power_of_2(GROUP)
        r = tl.arange(0, GROUP2 * CHUNK)  # tile row: head r // CHUNK, part s0 + r % CHUNK
        gh, c = r // CHUNK, r % CHUNK
        d = tl.arange(0, HD)
        base = part0 + gh * h_stride  # (GROUP2 * CHUNK,)
        m = tl.full([GROUP2], float("-inf"), tl.float32)
        den = tl.zeros([GROUP2], tl.float32)
        acc = tl.zeros([GROUP2, HD], tl.float32)
        for s0 in range(0, used, CHUNK):
            some = (s0 + c < used) & (gh < GROUP)
            part = base + (s0 + c) * s_stride
            lse = tl.load(plse_ptr + part, mask=some, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(po_ptr + part[:, None] * HD + d[None, :],
                        mask=some[:, None], other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(tl.reshape(lse, [GROUP2, CHUNK]), 1))
            w = tl.where(some, tl.exp(lse - tl.reshape(tl.broadcast_to(
                m_new[:, None], [GROUP2, CHUNK]), [GROUP2 * CHUNK])), 0.0)
            scale = tl.where(m > float("-inf"), tl.exp(m - m_new), 0.0)
            acc = acc * scale[:, None] + tl.sum(
                tl.reshape(w[:, None] * o, [GROUP2, CHUNK, HD]), 1)
            den = den * scale + tl.sum(tl.reshape(w, [GROUP2, CHUNK]), 1)
            m = m_new
        g = tl.arange(0, GROUP2)
        h = kvh * GROUP + g
        res = acc / tl.maximum(den, 1e-30)[:, None]
        tl.store(out_ptr + b * o_stride_b + h[:, None] * o_stride_h + d[None, :],
                 res.to(out_ptr.dtype.element_ty), mask=(g < GROUP)[:, None])

    @triton.jit
    def fold_key_block(q, m, denom, acc, keys_ptr, offs, live, seen, k_ptr, v_ptr, kvh,
                       kv_stride_t, kv_stride_h, sm_scale, HD: tl.constexpr):
        """One block of a paged row's keys folded into the online softmax (m, denom, acc) of q
        (rows, HD): positions `offs`, those in `live` present, their token locations at
        keys_ptr + offs (the row's page table); scores outside `seen` (rows or 1, keys) are
        -inf. Returns the new (m, denom, acc). The paged prefill kernel (paged_prefill.py) walks
        its keys with it too."""
        d = tl.arange(0, HD)
        loc = tl.load(keys_ptr + offs, mask=live, other=0)
        kv = loc[:, None] * kv_stride_t + kvh * kv_stride_h + d[None, :]
        k = tl.load(k_ptr + kv, mask=live[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * sm_scale  # (rows, keys)
        scores = tl.where(seen, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = tl.load(v_ptr + kv, mask=live[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        denom = denom * alpha + tl.sum(p, 1)
        return m_new, denom, acc

    # rows_stride is the graph's row count: one build for every size, not one per divisibility
    @triton.jit(do_not_specialize=["rows_stride"])
    def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, work_ptr, out_ptr, po_ptr,
                       plse_ptr, arrivals_ptr, sm_scale, rows_stride, table_stride, q_stride_b,
                       q_stride_h, kv_stride_t, kv_stride_h, o_stride_b, o_stride_h,
                       NH: tl.constexpr, NKV: tl.constexpr, GROUP: tl.constexpr,
                       GROUP_P: tl.constexpr, HD: tl.constexpr, BLOCK_N: tl.constexpr,
                       SPLITS: tl.constexpr, SPARE: tl.constexpr, CHUNK: tl.constexpr,
                       PDL: tl.constexpr):
        kvh = tl.program_id(1)
        wait_for_step_data(PDL)
        if SPARE == 0:  # shares decided here: program_id(2) of up to SPLITS per row
            b, s = tl.program_id(0), tl.program_id(2)
            slot = tl.load(rows_ptr + b)
            seq = tl.load(rows_ptr + rows_stride + b)
            tiles = tl.cdiv(seq, BLOCK_N)
            per = tl.cdiv(tiles, tl.minimum(tiles, SPLITS))
            used = tl.cdiv(tiles, per)
            part0 = (b * NH + kvh * GROUP) * SPLITS  # head g's part s: part0 + g * SPLITS + s
            s_stride, h_stride = 1, SPLITS
        else:  # listed shares: share 0 of row p, or the work list's item p - rows
            pid = tl.program_id(0)
            rows = tl.num_programs(0) - SPARE
            item = tl.maximum(pid - rows, 0)
            b = tl.where(pid < rows, pid, tl.load(work_ptr + item))
            s = tl.where(pid < rows, 0, tl.load(work_ptr + SPARE + item))  # -1: no item
            b = tl.maximum(b, 0)
            slot = tl.load(rows_ptr + b)
            seq = tl.load(rows_ptr + rows_stride + b)
            per = tl.load(rows_ptr + 2 * rows_stride + b)  # tiles per share, 0: the whole row
            used = tl.maximum(tl.load(rows_ptr + 3 * rows_stride + b), 1)
            per = tl.where(per == 0, tl.cdiv(seq, BLOCK_N), per)
            part0 = tl.load(rows_ptr + 4 * rows_stride + b) * NH + kvh * GROUP
            s_stride, h_stride = NH, 1
        g = tl.arange(0, GROUP_P)
        heads = kvh * GROUP + g
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + b * q_stride_b + heads[:, None] * q_stride_h + d[None, :],
                    mask=(g < GROUP)[:, None], other=0.0)
        m = tl.full([GROUP_P], float("-inf"), tl.float32)
        denom = tl.zeros([GROUP_P], tl.float32)
        acc = tl.zeros([GROUP_P, HD], tl.float32)
        # a program past `used` (or without an item) gets no keys: t0 >= seq
        t0 = tl.where(s >= 0, s * per * BLOCK_N, seq)
        t1 = tl.minimum(seq, t0 + per * BLOCK_N)
        for t in range(t0, t1, BLOCK_N):
            offs = t + tl.arange(0, BLOCK_N)
            live = offs < t1
            m, denom, acc = fold_key_block(q, m, denom, acc, table_ptr + slot * table_stride, offs,
                                           live, live[None, :], k_ptr, v_ptr, kvh, kv_stride_t,
                                           kv_stride_h, sm_scale, HD)
        o = acc / denom[:, None]
        if used == 1:  # the whole row in share 0; any others have no keys
            tl.store(out_ptr + b * o_stride_b + heads[:, None] * o_stride_h + d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=(g < tl.where(s == 0, GROUP, 0))[:, None])
        elif (s >= 0) & (s < used):
            part = part0 + s * s_stride + g * h_stride  # (GROUP_P,)
            tl.store(po_ptr + part[:, None] * HD + d[None, :], o, mask=(g < GROUP)[:, None])
            tl.store(plse_ptr + part, m + tl.log(denom), mask=g < GROUP)
            # Every thread's stores precede the one thread's release (the barrier), and the
            # program that arrives last sees every part (its acquire): it merges them and resets
            # the count for the next layer, which starts after this kernel has completed.
            tl.debug_barrier()
            arrival = tl.atomic_add(arrivals_ptr + b * NKV + kvh, 1, sem="acq_rel", scope="gpu")
            if arrival == used - 1:
                tl.store(arrivals_ptr + b * NKV + kvh, 0)
                _merge_group(out_ptr, po_ptr, plse_ptr, b, kvh, used, part0, s_stride, h_stride,
                             o_stride_b, o_stride_h, GROUP=GROUP, HD=HD, CHUNK=CHUNK)


def splits_for(batch: int, num_kv_heads: int, programs: int) -> int:
    """Programs per (row, KV head) where the device decides the shares: about `programs` in all,
    a power of two."""
    want = max(1, programs // max(1, batch * num_kv_heads))
    return min(MAX_SPLITS, 1 << (want - 1).bit_length())


def list_shares(seq_lens: list[int], shape: LaunchShape) -> dict[int, tuple[int, int]]:
    """The long rows' shares for a graph of listed shares: {row: (tiles per share, shares)}, for
    the rows of more than one share. A long row is one of more than `long_tiles` tiles. The long
    rows' tiles are shared out evenly over their own programs and the `spare` ones, in shares of
    at least `share_tiles` tiles: a single long row beside short ones is latency, not bandwidth,
    and its shares end it sooner the more programs walk it."""
    tiles = [-(-n // shape.block_n) for n in seq_lens]
    long = {i: t for i, t in enumerate(tiles) if t > shape.long_tiles}
    programs = len(long) + shape.spare
    per = max(shape.share_tiles, -(-sum(long.values()) // max(1, programs)))
    while sum(-(-t // per) for t in long.values()) > programs:
        per += 1
    return {i: (per, -(-t // per)) for i, t in long.items() if t > per}


def kernel_constants(num_heads: int, num_kv_heads: int, head_dim: int, shape: LaunchShape,
                     splits: int) -> dict[str, int]:
    """`_decode_kernel`'s compile-time arguments and launch options for one launch shape (PDL's
    apart: pdl.launch_kwargs). `bench resources` compiles the kernel with these too."""
    group = num_heads // num_kv_heads
    # the dot products' rows: the group padded to the 16 rows an MMA operand has at least
    return {"NH": num_heads, "NKV": num_kv_heads, "GROUP": group,
            "GROUP_P": max(16, triton.next_power_of_2(group)), "HD": head_dim,
            "BLOCK_N": shape.block_n, "SPLITS": splits, "SPARE": shape.spare,
            "CHUNK": MERGE_CHUNK, "num_warps": shape.warps, "num_stages": shape.stages}


class SmallBatchDecode:
    """The kernel's static state for decode graphs of up to `max_rows` rows: each row's slot and
    length (rewritten by `plan` before a replay), the long rows' shares and the work list of the
    spare programs (wide graphs), the parts' scratch and their arrival counts."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, sm_scale: float,
                 max_rows: int, page_table: torch.Tensor,
                 shape: LaunchShape | None = None) -> None:
        """shape: one launch shape at every row count; by default `shape_for` the rows."""
        assert num_heads % num_kv_heads == 0 and head_dim & (head_dim - 1) == 0
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.sm_scale, self.max_rows, self.page_table = sm_scale, max_rows, page_table
        self._shape = shape
        dev = page_table.device
        # The rows of a graph of B rows (`rows(B)`): slot, length; for listed shares also the
        # tiles per share (0: the whole row), the shares and the first of the row's parts. Each
        # a run of B values from the buffer's start, so a plan's rows are one plain copy (into a
        # strided slice torch copies through a temporary and a second kernel).
        self._rows = torch.zeros(5 * max_rows, dtype=torch.int64, device=dev)
        shapes = [self.shape_at(b) for b in range(1, max_rows + 1)]
        # the spare programs' items: row (-1: none) and share
        spare = max(sh.spare for sh in shapes)
        self.work = torch.full((2, max(1, spare)), -1, dtype=torch.int64, device=dev)
        self._listed = False  # some row's shares or the work list may be set
        # the host sides of `plan`'s copies, one plan a step (host_buffers.py)
        pin = dev.type == "cuda"
        self._host_rows, self._host_work = HostBuffers(pin), HostBuffers(pin)
        # a graph of B rows writes parts [0, B * num_heads * splits_for(B)) where the device
        # decides, [0, (B + spare) * num_heads) where the shares are listed
        parts = num_heads * max(
            b + sh.spare if sh.spare else b * splits_for(b, num_kv_heads, sh.programs)
            for b, sh in enumerate(shapes, 1))
        self._parts_o = torch.empty(parts, head_dim, dtype=torch.float32, device=dev)
        self._parts_lse = torch.empty(parts, dtype=torch.float32, device=dev)
        # per (row, KV head): how many of its programs have written their parts; the last one
        # merges and puts it back to 0
        self._arrivals = torch.zeros(max_rows * num_kv_heads, dtype=torch.int32, device=dev)

    def shape_at(self, rows: int) -> LaunchShape:
        return self._shape or shape_for(rows)

    @staticmethod
    def usable(device: torch.device, head_dim: int) -> bool:
        # 128 checked on the H200 (the GPU tests), 64 by the interpreter
        return triton is not None and device.type == "cuda" and head_dim in (64, 128)

    def rows(self, batch_size: int) -> torch.Tensor:
        """(5, batch_size) int64: the rows the graph of `batch_size` rows reads (a view)."""
        return self._rows[: 5 * batch_size].view(5, batch_size)

    def plan(self, batch_size: int, slots: list[int], seq_lens: list[int]) -> None:
        """Rows past len(slots) are padding: slot 0, one key (its result is never read). Plan each
        size once before its graph is captured (`plan(B, [], [])`: all padding): graphs of other
        sizes write the same buffer."""
        shape = self.shape_at(batch_size)
        if not shape.spare:  # slot and length only
            host = self._host_rows.pack_rows([slots, seq_lens], batch_size, (0, 1))
            self._rows[: 2 * batch_size].copy_(host.view(-1), non_blocking=True)
            return
        if max(seq_lens, default=0) <= shape.long_tiles * shape.block_n:
            # no row split: no shares (their rows are written anyway: a plan of another size
            # left its values there) and no items
            host = self._host_rows.pack_rows([slots, seq_lens, [], [], []], batch_size,
                                             (0, 1, 0, 0, 0))
            self._rows[: 5 * batch_size].copy_(host.view(-1), non_blocking=True)
            if self._listed:
                self.work.fill_(-1)
                self._listed = False
            return
        shares = list_shares(seq_lens, shape)
        per, used, first = ([0] * batch_size for _ in range(3))
        items = [[-1] * shape.spare, [-1] * shape.spare]
        part = extra = 0
        for i, (tiles, n) in shares.items():
            per[i], used[i], first[i] = tiles, n, part
            part += n
            for s in range(1, n):
                items[0][extra], items[1][extra] = i, s
                extra += 1
        host = self._host_rows.pack_rows([slots, seq_lens, per, used, first], batch_size,
                                         (0, 1, 0, 0, 0))
        self._rows[: 5 * batch_size].copy_(host.view(-1), non_blocking=True)
        work = self._host_work.pack_rows(items, shape.spare, (-1, -1))
        self.work[:, : shape.spare].copy_(work, non_blocking=True)
        self._listed = True

    def bind(self, batch_size: int) -> LayerCall:
        """The call that runs one layer for graphs of `batch_size` rows."""
        assert batch_size <= self.max_rows
        shape = self.shape_at(batch_size)
        splits = 1 if shape.spare else splits_for(batch_size, self.num_kv_heads, shape.programs)
        constants = kernel_constants(self.num_heads, self.num_kv_heads, self.head_dim, shape,
                                     splits)
        table = self.page_table
        grid = (batch_size + shape.spare, self.num_kv_heads, splits)

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
            # k, v: (num_pages, P, nkv, hd), token-major within a page and pages back to back
            # (runs when a graph is captured, not when it replays)
            assert k.stride(0) == k.size(1) * k.stride(1) and v.stride() == k.stride()
            _decode_kernel[grid](
                q, k, v, table, self._rows, self.work, out, self._parts_o, self._parts_lse,
                self._arrivals, self.sm_scale, batch_size, table.stride(0), q.stride(0),
                q.stride(1), k.stride(1), k.stride(2), out.stride(0), out.stride(1),
                **constants, **pdl.launch_kwargs())

        return call
