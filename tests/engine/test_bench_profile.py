"""`radixserve bench profile` on CPU: it times every phase of real decode steps and leaves the
engine idle with every KV page accounted for (it aborts its requests mid-decode, overlap on)."""

from __future__ import annotations

import math

from radixserve.engine.bench import profile
from radixserve.engine.bench.driver import build_core
from radixserve.engine.bench.models import write_model_dir


def test_profile_times_each_phase_and_returns_every_page(tmp_path):
    core = build_core(write_model_dir("tiny", str(tmp_path)), device="cpu", max_running_requests=4, page_size=1,
                      max_prefill_tokens=256)
    rows = [profile.profile_batch(core, batch, prompt_len=40, steps=5, trace=0) for batch in (1, 3)]
    assert [r["batch"] for r in rows] == [1, 3]
    for row in rows:
        phases = [row[f"{p}_ms"] for p in profile.PHASES]
        assert all(math.isfinite(v) and v >= 0 for v in phases)
        assert row["step_ms"] >= row["forward_ms"] > 0
    assert not core.has_work()
    core.check_integrity()  # free + evictable == total, no slot or request left behind
