"""The small-batch decode kernel (engine/attention/small_decode.py) run by Triton's interpreter
on a CPU, against softmax attention in float64: rows that fit one program and rows split over
several (merged by the last of their programs, which leaves the count at 0 for the next call),
rows never split, long rows of a wide graph split over its spare programs (the shares doubled
until they fit them, and cleared by the next plan without long rows), rows of one key, a tile
boundary and past it, pages in shuffled order, padded rows, and a group of query heads that is
not a power of two. On a GPU,
tests/engine/test_backends_gpu.py runs it in CUDA graphs."""

from __future__ import annotations

from triton_interpreter import cpu_only, run_interpreted

_INTERPRETED = """
import torch
from radixserve.engine.attention.small_decode import (DEFAULT_SHAPE, WIDE_SHAPE, SmallBatchDecode,
                                                      list_shares, splits_for)

torch.manual_seed(0)
HD, P, PAGES = 64, 16, 300
BLOCK_N = DEFAULT_SHAPE.block_n


def check(small, table, slots, lens, k_pages, v_pages):
    B = len(lens)
    NH, NKV = small.num_heads, small.num_kv_heads
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
        assert err < 1e-5, (lens, n, err, small.shape_at(B + 2))


# (query heads, KV heads, lengths, launch shape): groups of 4, and of 3 (not a power of two); at
# 8 programs every row is one program a KV head (no split); the wide graphs' tiles with rows
# short of `long_tiles`, and listed shares at 16-key tiles: rows past 2 tiles are long. 40, 100,
# 300 and 1,000 keys are 3, 7, 19 and 63 tiles, 92 on 4 + 64 programs: shares of 2 tiles, the
# least, on 48 of them; on 4 + 8 programs: shares of 9 (8 would take 13), so 300 keys in 3 shares
# and 1,000 in 7, 40 and 100 keys whole.
WIDE = WIDE_SHAPE._replace(programs=8)
LISTED = WIDE_SHAPE._replace(block_n=16, long_tiles=2, share_tiles=2)
LONG = [5, 40, 100, 300, 1000]
assert list_shares(LONG, LISTED) == {1: (2, 2), 2: (2, 4), 3: (2, 10), 4: (2, 32)}
assert list_shares(LONG, LISTED._replace(spare=8)) == {3: (9, 3), 4: (9, 7)}
assert list_shares([5, 1000], LISTED._replace(share_tiles=16)) == {1: (16, 4)}
assert list_shares([5, 32], LISTED) == {}
for NH, NKV, lens, shape in (
        (8, 2, [1], DEFAULT_SHAPE), (8, 2, [BLOCK_N, BLOCK_N + 1], DEFAULT_SHAPE),
        (8, 2, [5, 300, 2 * BLOCK_N, 1000], DEFAULT_SHAPE), (6, 2, [5, 1000], DEFAULT_SHAPE),
        (8, 2, [5, 300, 1000], DEFAULT_SHAPE._replace(programs=8)),
        (8, 2, [5, WIDE.block_n, WIDE.block_n + 1, 1000], WIDE),
        (8, 2, LONG, LISTED), (6, 2, LONG, LISTED._replace(spare=8)),
        (8, 2, [5, 32, 33], LISTED)):
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
    check(small, table, slots, lens, k_pages, v_pages)
    if shape.spare:  # the next plan has no long row: no share or item of this one is left
        check(small, table, slots, [min(n, 32) for n in lens], k_pages, v_pages)
        assert not small._listed and (small.work == -1).all()
print("small decode matches")
"""


@cpu_only
def test_small_batch_decode_in_the_triton_interpreter():
    assert "small decode matches" in run_interpreted(_INTERPRETED)
