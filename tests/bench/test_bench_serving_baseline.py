"""bench serving's offline baseline: the same requests through the offline engine, configured by
the flags the stack's scheduler gets, in a process of its own."""

from __future__ import annotations

import math
import subprocess

import pytest
from radixserve.bench import serving


def _cfg() -> serving.BenchConfig:
    return serving.BenchConfig("unused:0", (2,), num_prompts=3, input_len=8, output_len=4,
                               range_ratio=0.5, request_rate=float("inf"), temperature=0.0, seed=0)


def test_offline_baseline_runs_in_a_child_with_the_serve_flags() -> None:
    """Measured as a level is: output tokens a second, each request's time per output token
    after its first, and the time per engine step."""
    base = serving.offline_in_child("demo", _cfg(), ["--device", "cpu", "--page-size", "8"])
    assert base.tok_s > 0 and base.step_ms > 0
    assert base.tpot_ms["p50"] > 0  # outputs of 2 to 4 tokens: every request has one
    assert math.isnan(base.full_step_ms)  # three requests, slots to spare: none ever waited


def test_offline_baseline_times_the_steps_with_every_slot_busy_apart() -> None:
    """With one slot the requests wait their turn, and the steps before the last one is admitted
    are timed apart from the drain after it."""
    base = serving.offline_in_child("demo", _cfg(), ["--device", "cpu",
                                                     "--max-running-requests", "1"])
    assert base.full_step_ms > 0 and base.step_ms > 0


def test_offline_baseline_refuses_flags_serve_would_refuse() -> None:
    with pytest.raises(subprocess.CalledProcessError):
        serving.offline_in_child("demo", _cfg(), ["--device", "cpu", "--page-size", "0"])


def test_warm_up_fills_the_largest_level_per_replica_with_the_longest_prompts() -> None:
    """The warm-up runs a full batch of the largest level before anything is timed, in the
    baseline's child (which gets the levels) as in the served run, and seeds no cache hit."""
    import dataclasses

    cfg = dataclasses.replace(_cfg(), concurrencies=(1, 2), num_prompts=5)
    warm = serving.warm_up_work(cfg, vocab=1000, replicas=3)
    assert len(warm) == 6 and {len(p) for p in warm} == {8}
    work = {tuple(p) for p, _ in serving._workload(cfg, 1000)}
    assert not work & {tuple(p) for p in warm}
    capped = dataclasses.replace(cfg, concurrencies=(64,))
    assert len(serving.warm_up_work(capped, vocab=1000)) == 5  # no more than a level sends


def test_offline_baseline_child_gets_the_levels_its_warm_up_is_sized_by(monkeypatch) -> None:
    seen = []

    def run(argv, **_):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=(
            '{"tok_s": 1.5, "tpot_ms": {"mean": 2.0, "p50": 2.0, "p99": 3.0}, "step_ms": 1.9}\n'))

    monkeypatch.setattr(serving.subprocess, "run", run)
    cfg = serving.BenchConfig("unused:0", (4, 32), num_prompts=3, input_len=8, output_len=4,
                              range_ratio=0.5, request_rate=float("inf"), temperature=0.0, seed=0)
    assert serving.offline_in_child("demo", cfg, ["--device", "cpu"]).tok_s == 1.5
    argv = seen[0]
    assert argv[argv.index("--concurrency") + 1] == "4,32"
