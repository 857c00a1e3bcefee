"""`bench soak`'s RSS growth: a slope fitted after the warm-up, and the limit that fails a run."""

import asyncio
import os
import subprocess
import sys
import time

import pytest
from radixserve.bench import soak
from radixserve.bench.process import RssSeries, growth_table, service_pids


def _series(points: dict[str, list[tuple[float, float]]], warmup_s: float,
            pids: dict[str, list[int]] | None = None) -> RssSeries:
    """A series of `points` per service, each sample of process 1 unless `pids` says."""
    series = RssSeries({name: 0 for name in points}, every_s=60.0, warmup_s=warmup_s)
    series.samples = {name: [(t, rss, (pids or {}).get(name, [1] * len(pts))[i])
                             for i, (t, rss) in enumerate(pts)] for name, pts in points.items()}
    return series


def test_growth_is_the_slope_after_the_warmup() -> None:
    # 100 MiB flat after a warm-up that doubled it, then +1 MiB an hour: only the second part counts
    warm = [(t * 60.0, 50.0 + t * 10) for t in range(5)]
    leak = [(300.0 + t * 60.0, 100.0 + t / 60) for t in range(60)]
    flat = [(t * 60.0, 80.0) for t in range(65)]
    growth = _series({"gateway": warm + leak, "tokenizer": flat}, warmup_s=300.0).growth()
    g = growth["gateway"]
    assert g["samples"] == 60
    assert g["mib_per_h"] == pytest.approx(1.0)
    assert g["pct_per_h"] == pytest.approx(100 / 100.49, rel=1e-3)  # of the mean, 100.49 MiB
    assert (g["rss_min_mib"], g["rss_max_mib"]) == (100.0, pytest.approx(100 + 59 / 60))
    assert growth["tokenizer"]["mib_per_h"] == 0.0
    rows = growth_table(growth, 300.0)
    assert any(row.startswith("| gateway | 60 |") and "| every sample | +1.00 |" in row
               for row in rows)


def _saw(life_s: float, cut_s: float, peak: float) -> tuple[list, list]:
    """A recycled gateway sampled each minute for `cut_s` seconds: (samples, their pids); each
    process lives `life_s` and grows from 50 MiB to `peak` MiB at its last sample."""
    points, pids = [], []
    for k in range(int(cut_s // 60)):
        t = k * 60.0
        life = int(t // life_s)
        points.append((t, 50.0 + (peak - 50.0) * (t % life_s) / (life_s - 60)))
        pids.append(1000 + life)
    return points, pids


def test_a_recycled_service_is_fitted_through_the_peaks_of_its_lives() -> None:
    """A gateway replaced every 10 minutes grows 50 -> 80 MiB in each life: a line through the
    whole saw slopes by where the run cuts it (here +2 %/h and more), its lives' peaks are flat."""
    points, pids = _saw(life_s=600.0, cut_s=6000.0 + 540.0, peak=80.0)
    whole = _series({"gateway-1": points}, warmup_s=600.0).growth()["gateway-1"]
    assert whole["pct_per_h"] > 2.0 and whole["lives"] == 1  # one pid: the old fit
    g = _series({"gateway-1": points}, warmup_s=600.0, pids={"gateway-1": pids}).growth()
    g = g["gateway-1"]
    assert g["lives"] == 10 and g["fitted"] == 9  # the last life is cut by the run's end
    assert g["pct_per_h"] == pytest.approx(0.0, abs=1e-9)
    assert g["rss_max_mib"] == pytest.approx(80.0)
    rows = growth_table({"gateway-1": g}, 600.0)
    assert any("peaks of 9 ended lives (of 10 processes)" in row for row in rows)


def test_peaks_that_rise_from_life_to_life_are_growth() -> None:
    """What outlives a process (a shared file, a leak in the parent's state) raises each peak."""
    points, pids = _saw(life_s=600.0, cut_s=6000.0, peak=80.0)
    rising = [(t, rss + t / 360.0) for t, rss in points]  # +10 MiB an hour under the saw
    g = _series({"gateway-0": rising}, warmup_s=600.0, pids={"gateway-0": pids}).growth()
    assert g["gateway-0"]["mib_per_h"] == pytest.approx(10.0, rel=1e-6)


def test_too_few_samples_after_the_warmup_fit_nothing() -> None:
    series = _series({"scheduler": [(0.0, 1.0), (400.0, 2.0), (460.0, 3.0)]}, warmup_s=300.0)
    assert series.growth() == {}
    assert growth_table({}, 300.0) == []


def test_sampler_reads_live_processes_and_drops_an_exited_one() -> None:
    async def sample_briefly() -> RssSeries:
        series = RssSeries({"me": os.getpid(), "gone": 2**22 + 1}, every_s=0.01, warmup_s=0.0)
        task = asyncio.create_task(series.run())
        await asyncio.sleep(0.1)
        task.cancel()
        return series

    series = asyncio.run(sample_briefly())
    assert len(series.samples["me"]) >= 3
    assert all(rss > 0 and pid == os.getpid() for _, rss, pid in series.samples["me"])
    assert series.samples["gone"] == []


def test_a_service_above_the_limit_fails_the_run() -> None:
    result = soak.SoakResult(invariant_ok=True)
    assert result.passed
    result.too_fast = ["gateway"]
    assert not result.passed
    cfg = soak.SoakConfig("x", max_rss_growth_pct=1.0)
    assert "RSS growth above 1.0 %/h: gateway" in soak.format_table(cfg, result)
    with pytest.raises(ValueError, match="rss-every"):
        soak.SoakConfig("x", rss_every_s=0)


def test_the_queue_beside_the_rss_is_each_intervals_ttft_median() -> None:
    """The TTFT series tells a deeper queue (which grows heaps for a while) from a leak: each
    --rss-every interval gets the median TTFT of the requests whose first token came in it."""
    load = soak._Soak(soak.SoakConfig("x"), [], vocab=100, context=64)
    ok = soak.grpc.StatusCode.OK
    for t0, first in [(100.0, 100.5), (130.0, 130.1), (150.0, 161.0), (170.0, 185.0)]:
        load._record("normal", ok, 3, 3, t0, first)
    load._record("normal", ok, 0, 3, 190.0, None)  # no first token: counted, not in the series
    load._record("cancel", ok, 1, 3, 190.0, 190.2)  # only normal requests measure the queue
    assert load.ttft_series(start=100.0, every_s=60.0) == [
        (0.0, 2, pytest.approx(300.0)), (60.0, 2, pytest.approx(13000.0))]


def test_a_recycled_gateway_is_followed_to_its_new_process_under_its_own_name(tmp_path) -> None:
    """`serve` names a gateway with a probe socket after it; the sampler looks the pids up at
    every sample, so the series of gateway-1 goes on in the process that replaced it."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "gateway", "--probe-address",
            f"unix:{tmp_path}/gateway-1.sock"]
    old, new = subprocess.Popen(argv), subprocess.Popen(argv[:-1] + [f"unix:{tmp_path}/x.sock"])
    try:
        deadline = time.monotonic() + 30  # until both have exec'd
        while set(service_pids(os.getpid())) != {"gateway-1", "x"}:
            assert time.monotonic() < deadline, service_pids(os.getpid())
            time.sleep(0.05)
        assert service_pids(os.getpid()) == {"gateway-1": old.pid, "x": new.pid}
        old.kill()  # retired: only the lookups lead to its replacement
        old.wait()
        lookups = iter([{}])

        async def sample_three() -> RssSeries:
            series = RssSeries({"gateway-1": old.pid}, every_s=0.01, warmup_s=0.0,
                               resolve=lambda: next(lookups, {"gateway-1": new.pid}))
            task = asyncio.create_task(series.run())
            await asyncio.sleep(0.1)
            task.cancel()
            return series

        series = asyncio.run(sample_three())
        # every lookup but the empty one (a gateway between two processes) gave a sample of the
        # new process; the old pid would have given none
        assert len(series.samples["gateway-1"]) >= 3
        assert {pid for _, _, pid in series.samples["gateway-1"]} == {new.pid}
    finally:
        for proc in (old, new):
            proc.kill()
            proc.wait()
