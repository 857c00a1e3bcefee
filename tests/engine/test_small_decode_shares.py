"""How a wide decode graph shares out its long rows (engine/attention/small_decode.py): the plan
that `SmallBatchDecode.plan` writes for the kernel, checked on the host for many random batches.
The kernel that reads it runs in tests/engine/test_small_decode_interpreted.py (Triton's
interpreter) and tests/engine/test_backends_gpu.py (CUDA graphs)."""

from __future__ import annotations

import random

import pytest
import torch
from radixserve.engine.attention.small_decode import WIDE_SHAPE, SmallBatchDecode, list_shares

HD = 64


def _lengths(rng: random.Random, rows: int, long_rows: int) -> list[int]:
    lens = [rng.randint(1, 2048) for _ in range(rows)]
    for i in rng.sample(range(rows), long_rows):
        lens[i] = rng.randint(2049, 40000)
    return lens


@pytest.mark.parametrize("shape", [WIDE_SHAPE, WIDE_SHAPE._replace(spare=8, share_tiles=1),
                                   WIDE_SHAPE._replace(block_n=16, long_tiles=3, spare=100)])
def test_long_rows_are_cut_into_shares_that_cover_them_and_fit_the_spare_programs(shape):
    rng = random.Random(0)
    for _ in range(300):
        rows = rng.randint(33, 256)
        lens = _lengths(rng, rows, rng.randint(0, min(rows, 40)))
        shares = list_shares(lens, shape)
        tiles = [-(-n // shape.block_n) for n in lens]
        # extra shares (past each row's own program) fit the spare programs
        assert sum(n - 1 for _, n in shares.values()) <= shape.spare
        if not shares:
            continue
        # all long rows share one size, and it is the least that fits: a share one tile
        # smaller would need more programs than the long rows and the spare ones
        per = next(iter(shares.values()))[0]
        assert per >= shape.share_tiles and all(p == per for p, _ in shares.values())
        long = [t for t in tiles if t > shape.long_tiles]
        if per > shape.share_tiles:
            assert sum(-(-t // (per - 1)) for t in long) > len(long) + shape.spare
        for i, t in enumerate(tiles):
            if i in shares:  # every tile in one share, no share empty
                n = shares[i][1]
                assert t > shape.long_tiles and (n - 1) * per < t <= n * per
            else:  # whole: short, or a long row that fits one share
                assert t <= shape.long_tiles or t <= per


def test_rows_up_to_2048_keys_stay_whole_in_wide_graphs():
    assert list_shares([2048] * 256, WIDE_SHAPE) == {}
    assert list_shares([2049], WIDE_SHAPE) == {0: (4, 5)}  # 17 tiles of 128 keys


def test_the_plan_lists_each_share_once_and_a_plan_without_long_rows_clears_it():
    rng = random.Random(1)
    rows = 64
    table = torch.zeros(rows, 8, dtype=torch.int64)
    small = SmallBatchDecode(16, 8, HD, HD**-0.5, rows, table)
    spare = WIDE_SHAPE.spare
    assert small.shape_at(rows) == WIDE_SHAPE and small.work.shape == (2, spare)
    for _ in range(50):
        lens = _lengths(rng, rows - 3, rng.randint(1, 12))  # 3 padded rows
        small.plan(rows, list(range(rows - 3)), lens)
        shares = list_shares(lens, WIDE_SHAPE)
        per, used, first = (small.rows(rows)[k].tolist() for k in (2, 3, 4))
        items = list(zip(*small.work.tolist()))
        listed = [(r, s) for r, s in items if r >= 0]
        assert len(listed) == sum(n - 1 for _, n in shares.values())
        assert all(s == -1 for r, s in items if r < 0)
        # shares 1..n-1 of every split row, once each; its first part and the next row's do
        # not overlap, and all parts fit the scratch of rows + spare programs
        assert sorted(listed) == sorted((i, s) for i, (_, n) in shares.items()
                                        for s in range(1, n))
        parts = []
        for i in range(rows):
            if i in shares:
                assert (per[i], used[i]) == shares[i]
                parts += range(first[i], first[i] + used[i])
            else:
                assert per[i] == used[i] == 0  # whole row, read from its length
        assert len(parts) == len(set(parts)) and max(parts, default=0) < rows + spare
    small.plan(rows, [0], [100])
    assert not small.rows(rows)[2:].any() and (small.work == -1).all() and not small._listed


def test_narrow_graphs_decide_their_shares_on_the_device():
    table = torch.zeros(8, 8, dtype=torch.int64)
    small = SmallBatchDecode(16, 8, HD, HD**-0.5, 8, table)
    small.plan(8, list(range(8)), [40000] * 8)  # long rows, but a narrow graph
    assert not small._listed and (small.work == -1).all()
    assert small.rows(8)[:2].tolist() == [list(range(8)), [40000] * 8]


def test_graphs_of_other_sizes_leave_nothing_in_a_plans_rows():
    """Every size's rows start at the same buffer's start: a plan writes all of its own, so the
    shares of a wider graph's plan, or its lengths, never read as this one's."""
    table = torch.zeros(64, 8, dtype=torch.int64)
    small = SmallBatchDecode(16, 8, HD, HD**-0.5, 64, table)
    assert small.shape_at(48) == small.shape_at(64) == WIDE_SHAPE
    small.plan(64, list(range(64)), [9000] * 64)  # long rows: shares listed
    assert small.rows(64)[3].max() > 1
    small.plan(48, list(range(40)), [100] * 40)
    assert small.rows(48).tolist() == [list(range(40)) + [0] * 8, [100] * 40 + [1] * 8,
                                       [0] * 48, [0] * 48, [0] * 48]
    assert (small.work == -1).all()
    small.plan(16, [], [])  # a narrow graph's placeholder: all padding
    assert small.rows(16)[:2].tolist() == [[0] * 16, [1] * 16]
