"""The paged prefill kernel of the piecewise graphs (engine/attention/paged_prefill.py) against
causal softmax attention in float64: requests from position 0 and after a cached prefix, tiles cut
at block_m and a partial last one, rows before the prefill rows (a step's decode rows) and padding
after them left as they were, groups of 2, 4 and 3 query heads a KV head, pages in shuffled order;
the placeholder plan (no tile has work) and the steps a plan refuses. On a CPU Triton's
interpreter runs it (float32, head dim 64); on a GPU the kernel itself (bfloat16, head dim 128)."""

from __future__ import annotations

import pytest
import torch
from radixserve.engine.attention.base import StepLayout
from radixserve.engine.attention.paged_prefill import (
    DEFAULT_SHAPE,
    MAX_PARTS,
    SPARE_TILES,
    PagedPrefill,
    PrefillShape,
    block_rows,
    programs_for,
    work_list,
)
from triton_interpreter import cpu_only, run_interpreted

_CHECK = """
import torch
from radixserve.engine.attention.base import StepLayout
from radixserve.engine.attention.paged_prefill import PagedPrefill, PrefillShape

# short shares (many parts a tile, and shares that end where a tile's tokens begin) with each
# group; the default (these tiles' walks too short to split); no tile split; tiles of 128 rows;
# every key block walked under the causal mask (free_blocks off), split and not
DEEP = PrefillShape(block_n=16, programs=64, share_blocks=1)
CASES = [((4, 2), DEEP), ((8, 2), DEEP), ((6, 2), DEEP), ((4, 2), PrefillShape()),
         ((6, 2), PrefillShape(programs=0)), ((8, 2), DEEP._replace(tile_rows=128)),
         ((4, 2), PrefillShape(warps=8, tile_rows=128)), ((6, 2), DEEP._replace(free_blocks=False)),
         ((4, 2), PrefillShape(block_n=16, free_blocks=False))]


def check(device, dtype, HD, tol):
    torch.manual_seed(0)
    P, PAGES, WIDTH, BUCKET, D = 16, 200, 512, 176, 5
    for (NH, NKV), shape in CASES:
        k_pages = torch.randn(PAGES, P, NKV, HD, device=device, dtype=dtype)
        v_pages = torch.randn(PAGES, P, NKV, HD, device=device, dtype=dtype)
        table = torch.zeros(6, WIDTH, dtype=torch.int64)
        order = torch.randperm(PAGES)
        for slot in range(6):  # each slot's pages somewhere in the pool, not in order
            pages = order[(slot * 30) % PAGES:][: WIDTH // P].repeat(2)[: WIDTH // P]
            table[slot] = (pages[:, None] * P + torch.arange(P)).reshape(-1)[:WIDTH]
        table = table.to(device)
        paged = PagedPrefill(NH, NKV, HD, HD ** -0.5, table, max_keys=400, shape=shape)
        # from position 0 (three tiles of 32, the last partial), after a prefix (one token past a
        # tile boundary, and a short chunk), and a chunk of one token
        prefix, seq, slots = [0, 37, 100, 7], [70, 40, 165, 8], [3, 1, 5, 0]
        layout = StepLayout(torch.tensor(slots), prefix, seq, torch.zeros(1), table, P, slots)
        assert paged.plan(BUCKET, 0, None)  # the capture's placeholder: nothing to do
        q = torch.randn(BUCKET, NH, HD, device=device, dtype=dtype)
        out = torch.full((BUCKET, NH, HD), float("nan"), device=device, dtype=dtype)
        paged.bind(BUCKET)(q, k_pages, v_pages, out)
        assert out.isnan().all()
        assert paged.plan(BUCKET, D, layout)
        paged.bind(BUCKET)(q, k_pages, v_pages, out)
        kf = k_pages.reshape(-1, NKV, HD).double().cpu()
        vf = v_pages.reshape(-1, NKV, HD).double().cpu()
        qd, got, cpu_table = q.double().cpu(), out.double().cpu(), table.cpu()
        row = D
        for slot, p, s in zip(slots, prefix, seq):
            for pos in range(p, s):
                loc = cpu_table[slot, : pos + 1]
                k = kf[loc].repeat_interleave(NH // NKV, dim=1)  # (pos + 1, NH, HD)
                v = vf[loc].repeat_interleave(NH // NKV, dim=1)
                scores = torch.einsum("hd,nhd->hn", qd[row], k) * HD ** -0.5
                ref = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
                err = ((got[row] - ref).norm() / ref.norm()).item()
                assert err < tol, (NH, NKV, shape, slot, pos, err)
                row += 1
        # the decode rows before and the padding after are the graph's other calls' to write
        assert got[:D].isnan().all() and got[row:].isnan().all()
        # a split tile's last share put its count back for the next layer
        assert not paged._arrivals.any()
    print("paged prefill matches")
"""


def _layout(prefix: list[int], seq: list[int], slots: list[int]) -> StepLayout:
    table = torch.zeros(max(slots) + 1, 64, dtype=torch.int64)
    return StepLayout(torch.tensor(slots), prefix, seq, torch.zeros(1), table, 16, slots)


def test_tiles_cover_each_requests_new_tokens_in_order():
    layout = _layout([0, 37, 7], [70, 40, 8], [3, 1, 0])
    rows, counts, slots, starts, first, end, part, share, used = work_list(5, layout, 32)
    assert counts == [32, 32, 6, 3, 1]
    assert rows == [5, 37, 69, 75, 78]  # back to back from the first prefill row
    assert slots == [3, 3, 3, 1, 0]
    assert starts == [0, 32, 64, 37, 7]
    # without programs to share them out, each tile walks its keys whole
    assert first == [0] * 5 and end == [32, 64, 70, 40, 8] and used == [1] * 5


def _walks(columns: list[list[int]]) -> dict[tuple[int, int], list[tuple[int, int, int, int]]]:
    """Each tile's items, by its (first row, tokens): (first key, key end, part, share)."""
    walks: dict = {}
    for row, n, _, _, k0, k1, part, s, _ in zip(*columns):
        walks.setdefault((row, n), []).append((k0, k1, part, s))
    return walks


AIM = DEFAULT_SHAPE.programs // 8  # Qwen3-0.6B's 8 KV heads


@pytest.mark.parametrize("prefix, seq", [([0], [512]), ([1536], [2048]), ([3584], [4096]),
                                         ([100, 0], [612, 40]), ([0] * 8, [64] * 8)])
def test_long_walks_split_where_the_tiles_are_fewer_than_the_aim(prefix, seq):
    layout = _layout(prefix, seq, list(range(len(seq))))
    columns = work_list(0, layout, 32, AIM)
    whole = work_list(0, layout, 32)
    assert len(whole[0]) < AIM and len(columns[0]) <= AIM
    walks, parts = _walks(columns), set()
    for row, n, _, pos0, _, end, *_ in zip(*whole):
        shares = walks.pop((row, n))
        # the shares cover the tile's keys once, in order, each from a key every token sees
        assert [s for *_, s in shares] == list(range(len(shares)))
        assert shares[0][0] == 0 and shares[-1][1] == end
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
        assert all(k0 <= pos0 for k0, *_ in shares)
        if len(shares) > 1:  # consecutive parts of its own
            first = shares[0][2]
            assert all(part == first for _, _, part, _ in shares)
            assert not parts & set(range(first, first + len(shares)))
            parts |= set(range(first, first + len(shares)))
    assert not walks and len(parts) <= MAX_PARTS
    longest = max(k1 - k0 for k0, k1 in zip(columns[4], columns[5]))
    least = DEFAULT_SHAPE.share_blocks * DEFAULT_SHAPE.block_n
    if max(whole[5]) > least + 32:  # shares shorter than the longest whole walk, not too short
        assert least <= longest < max(whole[5])
        assert longest <= max(least, 2 * sum(whole[5]) // AIM) + 32
    else:
        assert columns == whole


def test_tiles_that_fill_the_aim_walk_whole():
    layout = _layout([0, 0], [512, 512], [0, 1])  # 32 tiles: as many as 0.6B's aim
    assert work_list(0, layout, 32, AIM) == work_list(0, layout, 32)
    # a shape that aims at no programs splits nothing
    table = torch.zeros(1, 512, dtype=torch.int64)
    assert PagedPrefill(16, 8, 128, 0.1, table, 512, PrefillShape(programs=0))._aim == 0
    columns = work_list(0, _layout([0], [512], [0]), 32, 0)
    assert columns[8] == [1] * 16 and columns[4] == [0] * 16


def test_tile_rows_fill_one_operand_whatever_the_group():
    assert [block_rows(nh, 2) for nh in (2, 4, 6, 8, 16)] == [64, 32, 16, 16, 8]
    assert [block_rows(nh, 2, 128) for nh in (2, 4, 8)] == [128, 64, 32]
    # a request's partial last tile is one of the spare ones past a tile per block_m rows, and
    # the shares of long walks take the shape's spare programs
    assert programs_for(176, 32, 2) == DEFAULT_SHAPE.programs // 2  # the aim, where more
    assert programs_for(4096, 32, 8) == 128 + SPARE_TILES


def test_plan_refuses_long_contexts_and_more_tiles_than_the_grid():
    table = torch.zeros(40, 64, dtype=torch.int64)
    paged = PagedPrefill(4, 2, 64, 0.125, table, max_keys=64)
    assert paged.plan(64, 1, _layout([0], [64], [0]))
    assert not paged.plan(64, 1, _layout([10], [65], [0]))  # 65 keys
    # one-token chunks: more tiles than the grid's 128 (the aim)
    grid = programs_for(64, paged.block_m, 2)
    many = _layout(list(range(grid + 1)), list(range(1, grid + 2)), list(range(grid + 1)))
    assert not paged.plan(64, 0, many)
    assert paged.plan(64, 0, _layout([0] * grid, [1] * grid, list(range(grid))))  # as many fit


@cpu_only
def test_paged_prefill_in_the_triton_interpreter():
    code = _CHECK + "\ncheck('cpu', torch.float32, 64, 1e-5)\n"
    assert "paged prefill matches" in run_interpreted(code)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_paged_prefill_on_the_gpu():
    scope: dict = {}
    exec(_CHECK, scope)
    scope["check"]("cuda", torch.bfloat16, 128, 2e-2)
