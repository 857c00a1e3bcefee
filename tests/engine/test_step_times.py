"""The engine's step-time histogram: each step that decoded lands in its bucket and kind, and the
scheduler exports the counts as a cumulative Prometheus histogram the serving bench can read."""

from prometheus_client import CollectorRegistry, generate_latest
from radixserve.bench.prometheus import Reading, observed_ms, parse
from radixserve.engine.step_times import BOUNDS, StepTimes
from radixserve.services.scheduler.metrics import EngineStatsCollector


def _reading(times: StepTimes) -> Reading:
    """One scrape of a scheduler whose engine kept `times`."""
    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(lambda: {"step_seconds": times.snapshot()}))
    return Reading([parse(generate_latest(registry).decode())])


def test_steps_land_in_their_bucket_and_kind() -> None:
    times = StepTimes()
    times.observe(False, 0.0071)
    times.observe(False, 0.0069)
    times.observe(True, 0.0105)
    times.observe(True, 5.0)  # beyond the last bound: +Inf
    decode, mixed = times.snapshot()["decode"], times.snapshot()["mixed"]
    assert sum(decode[0]) == 2 and abs(decode[1] - 0.014) < 1e-12
    i = next(k for k, b in enumerate(BOUNDS) if b >= 0.0071)
    assert decode[0][i] == 2 and BOUNDS[i - 1] < 0.0069  # both in the bucket (5.04, 6.35] ms
    assert mixed[0][-1] == 1 and sum(mixed[0]) == 2


def test_the_bench_reads_each_kind_between_two_scrapes() -> None:
    times = StepTimes()
    times.observe(False, 0.1)  # before the level: not counted
    before = _reading(times)
    for _ in range(99):
        times.observe(False, 0.007)
    times.observe(False, 0.030)
    for _ in range(10):
        times.observe(True, 0.012)
    after = _reading(times)
    decode = observed_ms(before, after, "radixserve_engine_step_seconds", (("kind", "decode"),))
    mixed = observed_ms(before, after, "radixserve_engine_step_seconds", (("kind", "mixed"),))
    assert decode["count"] == 100 and mixed["count"] == 10
    assert abs(decode["mean"] - (99 * 7 + 30) / 100) < 1e-6
    # quantiles within a bucket whose bounds are 2^(1/3) apart: within a quarter of the value
    assert 7 / 1.26 <= decode["p50"] <= 7 * 1.26 and 12 / 1.26 <= mixed["p99"] <= 12 * 1.26
    assert 7 / 1.26 <= decode["p99"] <= 30 * 1.26
