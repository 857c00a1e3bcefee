"""`radixserve bench copies` times every copy both ways, and the two ways stage the same values."""

from __future__ import annotations

import json

import torch
from radixserve.bench import copies


def test_every_copy_is_timed_both_ways(tmp_path) -> None:
    out = tmp_path / "copies.json"
    copies.main(["--device", "cpu", "--rows", "8,16", "--calls", "5", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rows"], r["copy"]) for r in rows] == [
        (n, c) for n in (8, 16)
        for c in ("step upload", "sampled ids back", "graph input rows", "attention plan rows")]
    assert all(r["allocator_us"] > 0 and r["buffers_us"] > 0 for r in rows)


def test_both_ways_copy_the_same_values() -> None:
    cpu = torch.device("cpu")
    for copy, ways in copies._cases(12, cpu).items():
        # cloned at once: the rows' two ways write the same device tensor
        got = [[t.clone() for t in (r if isinstance(r, list) else [r])]
               for r in (ways[way]() for way in ("allocator", "buffers"))]
        assert len(got[0]) == len(got[1]) > 0, copy
        assert all(torch.equal(a, b) for a, b in zip(*got)), copy
