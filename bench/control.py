"""`radixserve bench control`: the tensor-parallel control plane per step, host work only.

Rank 0 builds each step's plan (`PlanEncoder`, the bytes a TP engine sends), sends it on a control
channel, and a follower process receives it and rebuilds the batch (`PlanDecoder`): everything a
step costs before the follower can launch its forward, without the forward. Three steps as the
scheduler makes them (page size 16): a decode step of 1 row and of 256 rows (rows at staggered
positions, so one in 16 maps a new page), and a prefill step of 4 new 1024-token prompts.

Each step's four readings are CLOCK_MONOTONIC (perf_counter_ns on Linux, one clock for all the
host's processes): rank 0 before building, after building, after `send` returns; the follower
after `recv` returns and after decoding. Rank 0 sends the next plan --gap-ms after the follower
has applied the last one (as in an engine, where the forward's collectives keep the ranks in
step), so the follower is waiting for each plan, spinning (gap < 0.5 ms) or napping. The table
gives medians and p99 in microseconds: build, send (rank 0's call), deliver (built to received),
decode, and total (rank 0 starts building to the follower holding its batch).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from radixserve.bench.common import device_name, print_table, write_json
from radixserve.engine.distributed import CollectiveGuard
from radixserve.engine.kvcache.table import TableManager
from radixserve.engine.request import Req
from radixserve.engine.sampling.params import SamplingParams
from radixserve.engine.scheduler.batch import Batch
from radixserve.engine.tp.channel import open_channel
from radixserve.engine.tp.plan import PlanDecoder, PlanEncoder

PAGE, SLOTS, CONTEXT = 16, 272, 8192
CASES = ("decode-1", "decode-256", "prefill-4x1024")
PARAMS = SamplingParams(temperature=0, max_new_tokens=None)


def _table() -> TableManager:
    return TableManager(SLOTS, CONTEXT, PAGE, torch.device("cpu"))


def _decode_steps(table: TableManager, rows: int) -> Iterator[Batch]:
    reqs = [Req(f"d{i}", [7] * 1000, PARAMS, 4096, i) for i in range(rows)]
    for i, r in enumerate(reqs):
        r.slot = i
    pos = [1000 + 3 * i for i in range(rows)]  # staggered: a few rows cross a page each step
    next_page = 0
    while True:
        new = [i for i in range(rows) if pos[i] % PAGE == 0]
        if new:
            table.map_pages([reqs[i].slot for i in new], [pos[i] // PAGE for i in new],
                            list(range(next_page, next_page + len(new))))
            next_page = (next_page + len(new)) % 10000
        batch = Batch()
        for i, r in enumerate(reqs):
            batch.add(r, pos[i], pos[i] + 1, True)
            pos[i] = pos[i] + 1 if pos[i] < 3000 else 1000
        yield batch


def _prefill_steps(table: TableManager, rows: int = 4, prompt_len: int = 1024) -> Iterator[Batch]:
    rng, step = random.Random(0), 0
    while True:
        batch = Batch()
        for i in range(rows):
            ids = [rng.randrange(3, 150000) for _ in range(prompt_len)]
            req = Req(f"p{step}-{i}", ids, PARAMS, 128, step)
            req.slot = (step * rows + i) % SLOTS
            table.set_tokens(req.slot, 0, ids)
            table.alloc_pages(req.slot, 0, list(range(i * 64, i * 64 + prompt_len // PAGE)))
            batch.add(req, 0, prompt_len, True)
        step += 1
        yield batch


def _steps(case: str, table: TableManager) -> Iterator[Batch]:
    if case.startswith("decode"):
        return _decode_steps(table, int(case.split("-")[1]))
    return _prefill_steps(table)


def follower(port: int, kind: str) -> None:
    torch.set_num_threads(1)  # as rank 0: two ranks share the host
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    guard = CollectiveGuard(1, lambda: "rank 0 stopped answering")
    dist.init_process_group("gloo", store=store, rank=1, world_size=2)
    channel = open_channel(kind, 1, 2, store, guard)
    table = _table()
    decoder, times = PlanDecoder(table), []
    while True:
        data = channel.recv()
        t_recv = time.perf_counter_ns()
        batch = decoder.decode(data)
        t_done = time.perf_counter_ns()
        if batch is None:
            break
        times.append((t_recv, t_done))
        table.flush()  # the forward's first act, not timed
        store.add("done", 1)  # rank 0 paces itself on this, after the timed part
    store.set("result", json.dumps(times))
    channel.close()
    dist.destroy_process_group()


def leader(kind: str, steps: int, warmup: int, gap_s: float) -> list[dict[str, Any]]:
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True,
                          timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
    cmd = [sys.executable, "-m", "radixserve.bench.control", "--follower", str(store.port),
           "--channel", kind]
    proc = subprocess.Popen(cmd)
    try:
        dist.init_process_group("gloo", store=store, rank=0, world_size=2)
        channel = open_channel(kind, 0, 2, store, CollectiveGuard(0, lambda: "follower exited"))
        table, encoder = _table(), PlanEncoder()
        sent: list[tuple[str, int, int, int, int]] = []
        for case in CASES:
            batches = _steps(case, table)
            for _ in range(warmup + steps):
                batch = next(batches)
                t0 = time.perf_counter_ns()
                data = encoder.encode(batch, table)
                t1 = time.perf_counter_ns()
                channel.send(data)
                t2 = time.perf_counter_ns()
                sent.append((case, len(data), t0, t1, t2))
                table.flush()
                while int(store.add("done", 0)) < len(sent):
                    time.sleep(1e-4)
                time.sleep(gap_s)
        channel.send(encoder.encode_shutdown())
        got = json.loads(store.get("result"))
        channel.close()
        dist.destroy_process_group()
    finally:
        proc.wait(30)
    rows = []
    for case in CASES:
        runs = [(s, g) for s, g in zip(sent, got) if s[0] == case][warmup:]
        cols = {"build": [s[3] - s[2] for s, _ in runs], "send": [s[4] - s[3] for s, _ in runs],
                "deliver": [g[0] - s[3] for s, g in runs], "decode": [g[1] - g[0] for _, g in runs],
                "total": [g[1] - s[2] for s, g in runs]}
        row: dict[str, Any] = {"channel": kind, "step": case,
                               "plan_bytes": int(statistics.median(s[1] for s, _ in runs))}
        for name, ns in cols.items():
            ns.sort()
            row[f"{name}_us"] = statistics.median(ns) / 1e3
        row["total_p99_us"] = cols["total"][int(0.99 * (len(runs) - 1))] / 1e3
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="radixserve bench control", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channel", action="append", choices=["gloo", "shm"],
                    help="control channel to measure (repeatable; default: each)")
    ap.add_argument("--steps", type=int, default=300, help="timed steps per case")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps first, per case")
    ap.add_argument("--gap-ms", type=float, default=2.0,
                    help="rank 0's pause after the follower finished a step")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--follower", type=int, help=argparse.SUPPRESS)  # the spawned rank 1
    args = ap.parse_args(argv)
    kinds = args.channel or ["gloo", "shm"]
    if args.follower is not None:
        follower(args.follower, kinds[0])
        return 0
    torch.set_num_threads(1)
    rows = [r for kind in kinds for r in leader(kind, args.steps, args.warmup, args.gap_ms / 1e3)]
    print_table(f"TP control plane per step, 2 ranks on {device_name('cpu')} "
                f"(median us; gap {args.gap_ms} ms)", rows)
    write_json(args.json, {"benchmark": "control", "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
