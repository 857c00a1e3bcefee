"""The whole machine's CPU during a serving level (`bench/process.py: machine_cpu`) and its columns
in `bench serving`'s CPU table."""

from __future__ import annotations

import time

from radixserve.bench import serving
from radixserve.bench.process import machine_cpu


def test_the_machines_busy_cpu_includes_this_process() -> None:
    busy, stolen = machine_cpu()
    own = time.process_time()
    while time.process_time() - own < 0.3:
        pass
    own = time.process_time() - own
    busy_after, stolen_after = machine_cpu()
    # /proc/stat counts whole ticks (10 ms); whatever else the machine ran only adds to it
    assert busy_after - busy >= own - 0.05
    assert stolen_after >= stolen >= 0


def test_the_cpu_table_gives_the_machines_busy_and_stolen_cores() -> None:
    ms = {"mean": 1.0, "p50": 1.0, "p99": 2.0}
    level = serving.LevelResult(
        concurrency=2, request_rate=float("inf"), completed=4, failed=0, duration_s=2.0,
        output_tok_s=16.0, request_s=2.0, ttft_ms=ms, tpot_ms=ms, itl_ms=ms, e2e_ms=ms,
        goodput_s=2.0, cached_share=0.0, server_cached_share=0.0, routing="", replicas=[],
        service_cores={"gateway": 0.5}, client_cores=0.25, machine_cores=3.5,
        stolen_cores=0.125)
    head, row = serving.format_cores([level]).splitlines()[1::2]
    assert head.split()[-2:] == ["machine", "stolen"]
    assert row.split()[-2:] == ["3.50", "0.125"]
