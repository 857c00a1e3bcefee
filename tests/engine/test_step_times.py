"""The engine's step-time histogram: each step that decoded lands in its bucket and kind, and the
scheduler exports the counts as a cumulative Prometheus histogram the serving bench can read. The
host phases of each step call likewise, counted by a running engine."""

import time

import pytest
from prometheus_client import generate_latest
from radixserve.bench.prometheus import Reading, observed_ms, parse
from radixserve.engine import SamplingParams
from radixserve.engine.step_times import (
    BOUNDS,
    HOST_PHASES,
    PREFILL_CLASSES,
    StepTimes,
    prefill_class,
)
from radixserve.services.scheduler.metrics import scheduler_registry


def _reading(stats: dict) -> Reading:
    """One scrape of a scheduler whose engine's stats are `stats`."""
    return Reading([parse(generate_latest(scheduler_registry(lambda: stats)).decode())])


def test_a_scrape_by_name_builds_only_the_counts() -> None:
    """What bench abort polls every few milliseconds (`?name[]=...`) reads the loop's counts
    without building the step and phase histograms, which a full scrape has."""
    times = StepTimes()
    times.observe_step(0, 0.007)
    reads = []

    def snapshot() -> dict:
        reads.append(1)
        return {"running_requests": 7, "engine_steps_total": 40, "step_seconds": times.snapshot()}

    registry = scheduler_registry(snapshot)
    reads.clear()  # (registering reads nothing, but keep the count to the scrapes)
    names = ["radixserve_running_requests", "radixserve_engine_steps_total"]
    text = generate_latest(registry.restricted_registry(names)).decode()
    assert len(reads) == 1 and "radixserve_engine_step_seconds" not in text
    counts = Reading([parse(text)])
    assert counts.total("radixserve_running_requests") == 7
    assert counts.total("radixserve_engine_steps_total") == 40
    full = generate_latest(registry).decode()
    assert len(reads) == 3 and "radixserve_engine_step_seconds_bucket" in full


def test_steps_land_in_their_bucket_and_kind() -> None:
    times = StepTimes()
    times.observe_step(0, 0.0071)
    times.observe_step(0, 0.0069)
    times.observe_step(300, 0.0105)
    times.observe_step(3000, 5.0)  # beyond the last bound: +Inf
    decode, mixed = times.snapshot()["decode"], times.snapshot()["mixed"]
    assert sum(decode[0]) == 2 and abs(decode[1] - 0.014) < 1e-12
    i = next(k for k, b in enumerate(BOUNDS) if b >= 0.0071)
    assert decode[0][i] == 2 and BOUNDS[i - 1] < 0.0069  # both in the bucket (5.04, 6.35] ms
    assert mixed[0][-1] == 1 and sum(mixed[0]) == 2
    # and the mixed steps again by their prefill: 300 units in 257-512, 3000 in 2049+
    by_prefill = times.mixed.snapshot()
    assert [sum(by_prefill[c][0]) for c in PREFILL_CLASSES] == [0, 1, 0, 0, 1]
    assert [prefill_class(u) for u in (1, 256, 257, 2048, 2049)] == [
        "1-256", "1-256", "257-512", "1025-2048", "2049+"]


def test_the_bench_reads_each_kind_between_two_scrapes() -> None:
    times = StepTimes()
    times.observe_step(0, 0.1)  # before the level: not counted
    before = _reading({"step_seconds": times.snapshot(),
                       "mixed_step_seconds": times.mixed.snapshot()})
    for _ in range(99):
        times.observe_step(0, 0.007)
    times.observe_step(0, 0.030)
    for _ in range(10):
        times.observe_step(128, 0.012)
    after = _reading({"step_seconds": times.snapshot(),
                      "mixed_step_seconds": times.mixed.snapshot()})
    decode = observed_ms(before, after, "radixserve_engine_step_seconds", (("kind", "decode"),))
    mixed = observed_ms(before, after, "radixserve_engine_step_seconds", (("kind", "mixed"),))
    assert decode["count"] == 100 and mixed["count"] == 10
    small = observed_ms(before, after, "radixserve_engine_mixed_step_seconds",
                        (("prefill", "1-256"),))
    assert small["count"] == 10 and abs(small["mean"] - 12) < 1e-6
    assert abs(decode["mean"] - (99 * 7 + 30) / 100) < 1e-6
    # quantiles within a bucket whose bounds are 2^(1/3) apart: within a quarter of the value
    assert 7 / 1.26 <= decode["p50"] <= 7 * 1.26 and 12 / 1.26 <= mixed["p99"] <= 12 * 1.26
    assert 7 / 1.26 <= decode["p99"] <= 30 * 1.26


@pytest.mark.parametrize("overlap", [True, False])
def test_a_running_engine_times_each_phase_of_its_step_calls(ckpt, make_llm, overlap) -> None:
    core = make_llm(ckpt("qwen3"), overlap=overlap).core
    params = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    for i in range(3):
        core.add_request(f"r{i}", [3 + i, 9, 27, 81], params)
    calls, commands = 0, []
    while core.has_work():
        core.step(lambda wait_s=0.0: commands.append(time.sleep(0.002)) if not wait_s else None)
        calls += 1
    host = core.stats()["host_seconds"]
    count = {phase: sum(host[phase][0]) for phase in HOST_PHASES}
    # with overlap the first call only launches and the last only reads the step before it
    assert count["schedule"] == count["launch"] == calls - overlap
    assert count["wait"] == count["process"] == calls - overlap
    assert count["commands"] == calls and host["commands"][1] >= 0.002 * calls
    assert count["loop"] == calls - 1  # between calls while work was left: not after the last
    # exported by phase, as the serving bench reads it
    reading = _reading(core.stats())
    assert reading.total("radixserve_engine_host_seconds_count", (("phase", "launch"),)) == (
        count["launch"])
