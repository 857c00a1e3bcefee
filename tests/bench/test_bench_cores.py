"""`radixserve bench cores`: the work timed on one CPU beside a spinner on each other CPU in turn
and beside all of them, each against the work alone just before it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from radixserve.bench import cores


def test_cores_times_the_work_beside_each_other_cpu(tmp_path: Path) -> None:
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("one CPU: no other to spin on")
    out = tmp_path / "cores.json"
    try:
        assert cores.main(["--cpu", str(min(mine)), "--rounds", "200", "--repeats", "1",
                           "--json", str(out)]) == 0
    finally:
        os.sched_setaffinity(0, mine)  # main() pins the process it runs in
    report = json.loads(out.read_text())
    spun = [r["spinning on"] for r in report["rows"]]
    others = sorted(mine - {min(mine)})
    assert spun == [*map(str, others), f"all {len(others)} others"]
    assert all(r["alone ms"] > 0 and r["beside ms"] > 0 for r in report["rows"])
    assert report["stolen_cores"] >= 0


def test_cores_refuses_a_cpu_it_may_not_use() -> None:
    with pytest.raises(SystemExit):
        cores.main(["--cpu", str(max(os.sched_getaffinity(0)) + 1000)])
