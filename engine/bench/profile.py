"""`radixserve bench profile`: where one decode step's time goes, host phase by phase.

Runs decode steps of B rows (B from --batches) the way EngineCore.step does with overlap on, timing
each host phase with perf_counter: schedule, forward (everything up to the launch of the step),
wait (blocked on the previous step's sampled ids) and process (appending tokens, finish checks).
With overlap, a step costs max(host, device): when `wait` is near 0 the host is the bottleneck.
--trace also runs a torch.profiler pass and prints the top host ops and the summed kernel time
per step (device busy time), so host and device can be set side by side.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from typing import Any

import torch

from radixserve.engine.bench.common import device_name, print_table, write_json
from radixserve.engine.bench.driver import build_core, greedy_params, median, release
from radixserve.engine.bench.models import write_model_dir
from radixserve.engine.core import EngineCore

PHASES = ("schedule", "forward", "wait", "process")


def _fill(core: EngineCore, batch: int, prompt_len: int, steps: int) -> None:
    rng = random.Random(0)
    for i in range(batch):
        ids = [rng.randrange(10000) for _ in range(prompt_len)]
        core.add_request(f"p{i}", ids, greedy_params(steps + 64))
    while core.scheduler.waiting or any(not r.prefill_done for r in core.scheduler.running):
        core.step()
    for _ in range(4):
        core.step()


def _timed_steps(core: EngineCore, steps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    in_flight, core._in_flight = core._in_flight, None  # the step core.step() left in flight
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = core.scheduler.schedule()
        t1 = time.perf_counter()
        out = core.engine.forward(batch)
        t2 = time.perf_counter()
        if in_flight is not None:
            in_flight[1].wait()
            t3 = time.perf_counter()
            core._process(*in_flight)
        else:
            t3 = t2
        t4 = time.perf_counter()
        in_flight = (batch, out)
        for name, a, b in zip(PHASES, (t0, t1, t2, t3), (t1, t2, t3, t4)):
            times[name].append(b - a)
        times["step"].append(t4 - t0)
    core._in_flight = in_flight
    return times


def _trace(core: EngineCore, steps: int, top: int) -> float:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            core.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))
    if torch.cuda.is_available():
        print(events.table(sort_by="self_cuda_time_total", row_limit=top))
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    return kernel_us / steps / 1e3


def profile_batch(core: EngineCore, batch: int, prompt_len: int, steps: int, trace: int) -> dict[str, Any]:
    _fill(core, batch, prompt_len, steps + trace)
    times = _timed_steps(core, steps)
    row: dict[str, Any] = {"batch": batch}
    row.update({f"{k}_ms": 1e3 * median(v) for k, v in times.items()})
    if trace:
        row["kernels_ms"] = _trace(core, trace, top=25)
    for rid in list(core._reqs):
        core.abort(rid)
    while core.has_work():
        core.step()
    return row


def profile_offline(core: EngineCore) -> list[dict[str, Any]]:
    """The DESIGN.md §7 offline workload, steps grouped by kind: where its wall time goes."""
    from radixserve.engine.bench.suite import offline_requests

    for i, (ids, params) in enumerate(offline_requests(core.model_info.vocab_size)):
        core.add_request(f"o{i}", ids, params)
    kinds: dict[str, list[float]] = defaultdict(list)
    rows: dict[str, list[int]] = defaultdict(list)
    start = time.perf_counter()
    while core.has_work():
        t0 = time.perf_counter()
        core.step()
        if core._in_flight is None:  # nothing launched (with overlap on, the launched step waits there)
            continue
        batch = core._in_flight[0]
        tokens = sum(s - p for s, p in zip(batch.seq_lens, batch.prefix_lens))
        kind = "decode" if tokens == len(batch.reqs) else "prefill+mixed"
        kinds[kind].append(time.perf_counter() - t0)
        rows[kind].append(len(batch.reqs))
    wall = time.perf_counter() - start
    out = [{"kind": k, "steps": len(v), "total_s": sum(v), "share": sum(v) / wall, "median_ms": 1e3 * median(v),
            "mean_rows": sum(rows[k]) / len(v)} for k, v in kinds.items()]
    # Decode steps by batch size band: the long tail of a shrinking batch costs steps, not tokens.
    for lo, hi in ((1, 32), (33, 128), (129, 1 << 20)):
        band = [t for t, b in zip(kinds["decode"], rows["decode"]) if lo <= b <= hi]
        if band:
            out.append({"kind": f"decode rows {lo}-{min(hi, 256)}", "steps": len(band), "total_s": sum(band),
                        "share": sum(band) / wall, "median_ms": 1e3 * median(band), "mean_rows": float("nan")})
    out.append({"kind": "all", "steps": sum(len(v) for v in kinds.values()), "total_s": wall, "share": 1.0,
                "median_ms": float("nan"), "mean_rows": float("nan")})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench profile", description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b", help="a name from bench/models.py (random weights)")
    ap.add_argument("--root", default="/tmp/radixserve-bench-models")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--trace", type=int, default=0, help="also profile this many steps with torch.profiler")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--offline", action="store_true", help="profile the DESIGN.md §7 offline workload instead")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    core = build_core(write_model_dir(args.model, args.root), device=args.device, max_running_requests=max(batches),
                      cuda_graph=not args.no_cuda_graph, max_prefill_tokens=8192)
    try:
        if args.offline:
            rows = profile_offline(core)
        else:
            rows = [profile_batch(core, b, args.prompt_len, args.steps, args.trace) for b in batches]
    finally:
        release(core)
    print_table(f"decode step profile (medians): {args.model} on {device_name(args.device)}", rows)
    write_json(args.json, {"bench": "profile", "args": vars(args), "device": device_name(args.device), "rows": rows})


if __name__ == "__main__":
    main()
