"""TableManager: many slots' new pages in one write, and what tensor-parallel followers replay."""

from __future__ import annotations

import torch
from radixserve.engine.kvcache.table import TableManager

CPU = torch.device("cpu")


def table() -> TableManager:
    return TableManager(max_slots=4, max_context=32, page_size=4, device=CPU)


def test_map_pages_writes_each_slot_like_alloc_pages():
    one, many = table(), table()
    for t in (one, many):
        t.alloc_pages(1, 0, [3, 9])
    one.alloc_pages(2, 1, [7])
    one.alloc_pages(0, 3, [5])
    many.map_pages([2, 0], [1, 3], [7, 5])
    assert torch.equal(one.page_table_cpu, many.page_table_cpu)
    one.flush()
    many.flush()
    assert torch.equal(one.page_table, many.page_table)
    assert many.page_table[2, 4:8].tolist() == [28, 29, 30, 31]
    assert many.page_table[0, 12:16].tolist() == [20, 21, 22, 23]


def test_pending_writes_split_a_many_slot_write_into_rows_and_replay_exactly():
    lead, follower = table(), table()
    lead.set_tokens(3, 0, [11, 12, 13])
    lead.map_pages([2, 0, 2], [1, 3, 2], [7, 5, 6])  # slot 2 twice, apart: two writes
    writes = lead.pending_writes()
    assert [(w.target, w.slot, w.start, w.values.tolist()) for w in writes] == [
        ("token_pool", 3, 0, [11, 12, 13]),
        ("page_table", 2, 4, [28, 29, 30, 31]),
        ("page_table", 0, 12, [20, 21, 22, 23]),
        ("page_table", 2, 8, [24, 25, 26, 27]),
    ]
    follower.replay(writes)
    lead.flush()
    follower.flush()
    assert torch.equal(lead.page_table, follower.page_table)
    assert torch.equal(lead.page_table_cpu, follower.page_table_cpu)
    assert torch.equal(lead.token_pool, follower.token_pool)


def test_flush_with_nothing_queued_makes_no_buffer(monkeypatch):
    """A flush between writes is free: no host buffer taken (pinned on CUDA), no copy."""
    t = table()
    t.alloc_pages(1, 0, [3])
    t.flush()
    taken = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: taken.append(a) or real_empty(*a, **k))
    t.flush()
    assert taken == []
    assert t.page_table[1, :4].tolist() == [12, 13, 14, 15]
