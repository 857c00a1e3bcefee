"""`radixserve bench long` on CPU with the tiny model: the row it reports for each chunk size."""

from __future__ import annotations

import json

import pytest
from radixserve.bench import driver, long


@pytest.mark.parametrize("ratio", [0.0, 1.5])
def test_each_chunk_size_reports_short_itl_long_ttft_and_what_the_engine_learned(
        tmp_path, monkeypatch, ratio):
    monkeypatch.setitem(driver.ENGINE_OVERRIDES, "mixed_step_ratio", ratio)
    out = tmp_path / "long.json"
    long.main(["--model", "tiny", "--root", str(tmp_path), "--num-short", "4", "--short-len", "8",
               "--short-out", "12", "--num-long", "2", "--long-len", "128", "--long-out", "2",
               "--long-every", "2", "--chunk", "32,64", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["chunked"], r["max_prefill_tokens"]) for r in rows] == [
        (True, 32), (True, 64), (False, 128 + 8)]
    for r in rows:
        assert 0 < r["short_itl_p50_ms"] <= r["short_itl_p99_ms"] <= r["short_itl_max_ms"]
        assert r["long_ttft_mean_s"] > 0 and r["decode_step_ms"] > 0
        # off, the cap stays 0; on, it is learned from steps that decode beside a chunk of at
        # least 32 tokens and slower than a plain decode step, which timing on a busy machine
        # may not give, so only its form is checked
        assert isinstance(r["prefill_cap"], int) and r["prefill_cap"] >= 0
        assert isinstance(r["long_chunk"], int) and 0 <= r["long_chunk"] < r["max_prefill_tokens"]
        assert r["long_chunk_min"] <= r["long_chunk_max"] < r["max_prefill_tokens"]
        if r["long_chunk"]:  # the last step's chunk lies within the run's range
            assert r["long_chunk_min"] <= r["long_chunk"] <= r["long_chunk_max"]
        if ratio == 0:
            assert r["prefill_cap"] == r["long_chunk"] == r["long_chunk_max"] == 0
