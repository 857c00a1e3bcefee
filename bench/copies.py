"""`radixserve bench copies`: host time of a decode step's small copies, staged two ways.

A decode step of B rows copies a few hundred integers to the device four times (the step's upload,
the decode graph's input rows, the graph attention's plan rows) and its sampled ids back once.
Each copy is timed here on its own, per call, staged either way:

- `allocator`: a new host tensor per call: pinned from torch's caching host allocator for the
  upload and the ids (`upload_columns` without buffers, `Tensor.to("cpu", non_blocking=True)`),
  `torch.tensor` of the lists for the rows;
- `buffers`: the engine's way, host buffers of its own reused two steps later
  (engine/host_buffers.py).

Calls follow the engine's order of steps: each records an event after its copy and waits for the
event of the call before the previous one, so a buffer is written again only once its copy has run.
Host time only (the copies themselves are the device's); medians over --calls. On a CPU the
copies are plain memory copies and nothing is pinned.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any, Callable

import torch
from radixserve.bench.common import device_name, print_table, write_json
from radixserve.engine.host_buffers import HostBuffers
from radixserve.engine.upload import upload_columns


def _timed(call: Callable[[], Any], calls: int, device: torch.device) -> float:
    """Median host microseconds of `call`, waiting two calls back as the engine does."""
    cuda = device.type == "cuda"
    events: list[Any] = [None, None]
    times = []
    for i in range(calls + 10):  # the first ten warm the allocator and the buffers
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        if i >= 10:
            times.append(t1 - t0)
        if cuda:
            if events[i % 2] is not None:
                events[i % 2].synchronize()
            events[i % 2] = torch.cuda.Event()
            events[i % 2].record()
    if cuda:
        torch.cuda.synchronize(device)
    return statistics.median(times) * 1e6


def _cases(rows: int, device: torch.device) -> dict[str, dict[str, Callable[[], Any]]]:
    rng = random.Random(0)
    slots = rng.sample(range(max(256, rows)), rows)
    lens = [rng.randrange(512, 1536) for _ in range(rows)]
    pin = device.type == "cuda"
    i64, f32 = torch.int64, torch.float32
    # a sampled decode step's upload: seven index columns and five sampling options
    columns = [(slots, i64), (lens, i64), ([1] * rows, i64), (list(range(rows)), i64),
               (list(range(rows)), i64), (slots, i64), (lens, i64), ([False] * rows, torch.bool),
               ([0.6] * rows, f32), (slots, i64), (lens, i64), ([rows] * rows, i64)]
    ids = torch.randint(0, 150_000, (rows,), device=device)
    graph_rows = torch.zeros(3, rows, dtype=i64, device=device)
    plan_rows = torch.zeros(2, rows, dtype=i64, device=device)
    up, out, graph, plan = (HostBuffers(pin) for _ in range(4))
    return {
        "step upload": {
            "allocator": lambda: upload_columns(columns, device),
            "buffers": lambda: upload_columns(columns, device, up),
        },
        "sampled ids back": {
            "allocator": lambda: ids.to("cpu", non_blocking=True),
            "buffers": lambda: out.receive([ids]),
        },
        "graph input rows": {
            "allocator": lambda: graph_rows.copy_(
                torch.tensor([slots, lens, [1] * rows]), non_blocking=True),
            "buffers": lambda: graph_rows.copy_(
                graph.pack_rows([slots, lens, [1] * rows], rows, (0, 0, 0)), non_blocking=True),
        },
        "attention plan rows": {
            "allocator": lambda: plan_rows.copy_(torch.tensor([slots, lens]), non_blocking=True),
            "buffers": lambda: plan_rows.copy_(plan.pack_rows([slots, lens], rows, (0, 1)),
                                               non_blocking=True),
        },
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench copies", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", default="64,192", help="comma-separated decode rows")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json", default=None, help="also write the table to this JSON file")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    table = []
    for rows in (int(r) for r in a.rows.split(",")):
        for copy, ways in _cases(rows, device).items():
            us = {way: _timed(call, a.calls, device) for way, call in ways.items()}
            table.append({"rows": rows, "copy": copy, "allocator_us": us["allocator"],
                          "buffers_us": us["buffers"],
                          "ratio": us["buffers"] / us["allocator"]})
    print_table(f"host time a call (medians of {a.calls}): {device_name(a.device)}", table)
    write_json(a.json, {"part": "copies", "device": device_name(a.device), "rows": table})


if __name__ == "__main__":
    main()
