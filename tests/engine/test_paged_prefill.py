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
    SPARE_TILES,
    PagedPrefill,
    block_rows,
    tiles_for,
    work_list,
)
from triton_interpreter import cpu_only, run_interpreted

_CHECK = """
import torch
from radixserve.engine.attention.base import StepLayout
from radixserve.engine.attention.paged_prefill import PagedPrefill


def check(device, dtype, HD, tol):
    torch.manual_seed(0)
    P, PAGES, WIDTH, BUCKET, D = 16, 200, 512, 176, 5
    for NH, NKV in ((4, 2), (8, 2), (6, 2)):
        k_pages = torch.randn(PAGES, P, NKV, HD, device=device, dtype=dtype)
        v_pages = torch.randn(PAGES, P, NKV, HD, device=device, dtype=dtype)
        table = torch.zeros(6, WIDTH, dtype=torch.int64)
        order = torch.randperm(PAGES)
        for slot in range(6):  # each slot's pages somewhere in the pool, not in order
            pages = order[(slot * 30) % PAGES:][: WIDTH // P].repeat(2)[: WIDTH // P]
            table[slot] = (pages[:, None] * P + torch.arange(P)).reshape(-1)[:WIDTH]
        table = table.to(device)
        paged = PagedPrefill(NH, NKV, HD, HD ** -0.5, table, max_keys=400)
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
                assert err < tol, (NH, NKV, slot, pos, err)
                row += 1
        # the decode rows before and the padding after are the graph's other calls' to write
        assert got[:D].isnan().all() and got[row:].isnan().all()
    print("paged prefill matches")
"""


def _layout(prefix: list[int], seq: list[int], slots: list[int]) -> StepLayout:
    table = torch.zeros(max(slots) + 1, 64, dtype=torch.int64)
    return StepLayout(torch.tensor(slots), prefix, seq, torch.zeros(1), table, 16, slots)


def test_tiles_cover_each_requests_new_tokens_in_order():
    layout = _layout([0, 37, 7], [70, 40, 8], [3, 1, 0])
    rows, counts, slots, starts = work_list(5, layout, 32)
    assert counts == [32, 32, 6, 3, 1]
    assert rows == [5, 37, 69, 75, 78]  # back to back from the first prefill row
    assert slots == [3, 3, 3, 1, 0]
    assert starts == [0, 32, 64, 37, 7]


def test_tile_rows_fill_one_operand_whatever_the_group():
    assert [block_rows(nh, 2) for nh in (2, 4, 6, 8, 16)] == [64, 32, 16, 16, 8]
    # a request's partial last tile is one of the spare ones past a tile per block_m rows
    assert tiles_for(176, 32) == 6 + SPARE_TILES


def test_plan_refuses_long_contexts_and_more_tiles_than_the_grid():
    table = torch.zeros(40, 64, dtype=torch.int64)
    paged = PagedPrefill(4, 2, 64, 0.125, table, max_keys=64)
    assert paged.plan(64, 1, _layout([0], [64], [0]))
    assert not paged.plan(64, 1, _layout([10], [65], [0]))  # 65 keys
    # 40 one-token chunks: 40 tiles against the grid's 2 + 16
    many = _layout(list(range(40)), list(range(1, 41)), list(range(40)))
    assert tiles_for(64, paged.block_m) < 40 and not paged.plan(64, 0, many)
    assert paged.plan(64, 0, _layout([0] * 18, [1] * 18, list(range(18))))  # 18 tiles fit


@cpu_only
def test_paged_prefill_in_the_triton_interpreter():
    code = _CHECK + "\ncheck('cpu', torch.float32, 64, 1e-5)\n"
    assert "paged prefill matches" in run_interpreted(code)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_paged_prefill_on_the_gpu():
    scope: dict = {}
    exec(_CHECK, scope)
    scope["check"]("cuda", torch.bfloat16, 128, 2e-2)
