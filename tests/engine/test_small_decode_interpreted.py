"""The small-batch decode kernel (engine/attention/small_decode.py) run by Triton's interpreter
on a CPU, against softmax attention in float64: rows that fit one program and rows split over
several (merged by the last of their programs, which leaves the count at 0 for the next call),
rows never split (as at 64 rows and more), rows of one key, a tile boundary and past it, pages
in shuffled order, padded rows, and a group of query heads that is not a power of two. On a GPU,
tests/engine/test_backends_gpu.py runs it in CUDA graphs."""

from __future__ import annotations

from triton_interpreter import cpu_only, run_interpreted

_INTERPRETED = """
import torch
from radixserve.engine.attention.small_decode import (DEFAULT_SHAPE, WIDE_SHAPE, SmallBatchDecode,
                                                      splits_for)

torch.manual_seed(0)
HD, P, PAGES = 64, 16, 300
BLOCK_N = DEFAULT_SHAPE.block_n
# (query heads, KV heads, lengths, launch shape): groups of 4, and of 3 (not a power of two); at
# 8 programs every row is one program a KV head (no split), as in graphs of 64 rows and more,
# with the tiles of the narrow graphs and of the wide ones
WIDE = WIDE_SHAPE._replace(programs=8)
for NH, NKV, lens, shape in (
        (8, 2, [1], DEFAULT_SHAPE), (8, 2, [BLOCK_N, BLOCK_N + 1], DEFAULT_SHAPE),
        (8, 2, [5, 300, 2 * BLOCK_N, 1000], DEFAULT_SHAPE), (6, 2, [5, 1000], DEFAULT_SHAPE),
        (8, 2, [5, 300, 1000], DEFAULT_SHAPE._replace(programs=8)),
        (8, 2, [5, WIDE.block_n, WIDE.block_n + 1, 1000], WIDE)):
    k_pages = torch.randn(PAGES, P, NKV, HD)
    v_pages = torch.randn(PAGES, P, NKV, HD)
    B = len(lens)
    width = 1024
    table = torch.zeros(B + 2, width, dtype=torch.int64)
    order = torch.randperm(PAGES)
    for slot in range(B + 2):  # each slot's pages somewhere in the pool, not in order
        pages = order[(slot * 40) % PAGES:][: width // P].repeat(2)[: width // P]
        table[slot] = (pages[:, None] * P + torch.arange(P)).reshape(-1)[:width]
    slots = [B + 1 - i for i in range(B)]
    small = SmallBatchDecode(NH, NKV, HD, HD ** -0.5, max_rows=B + 2, page_table=table,
                             shape=shape)
    assert (splits_for(B + 2, NKV, shape.programs) == 1) == (shape.programs == 8)
    small.plan(B + 2, slots, lens)  # two padded rows
    q = torch.randn(B + 2, NH, HD)
    out = torch.full((B + 2, NH, HD), float("nan"))
    small.bind(B + 2)(q, k_pages, v_pages, out)
    # the arrival counts are back at 0, so the next layer (here: the same call) merges again
    assert not small._arrivals.any()
    again = torch.full_like(out, float("nan"))
    small.bind(B + 2)(q, k_pages, v_pages, again)
    assert torch.equal(again[:B], out[:B])
    kf, vf = k_pages.reshape(-1, NKV, HD).double(), v_pages.reshape(-1, NKV, HD).double()
    for i, (slot, n) in enumerate(zip(slots, lens)):
        loc = table[slot, :n]
        k = kf[loc].repeat_interleave(NH // NKV, dim=1)  # (n, NH, HD)
        v = vf[loc].repeat_interleave(NH // NKV, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].double(), k) * HD ** -0.5
        ref = torch.einsum("hn,nhd->hd", s.softmax(-1), v)
        err = ((out[i].double() - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (lens, n, err, shape)
print("small decode matches")
"""


@cpu_only
def test_small_batch_decode_in_the_triton_interpreter():
    assert "small decode matches" in run_interpreted(_INTERPRETED)
