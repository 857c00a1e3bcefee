"""`radixserve bench cores`: which of the machine's CPUs slow Python work on one CPU.

The served engine thread's host work takes two to three times as long when the machine is busy
(docs/benchmarks.md, "GPU, twenty-ninth round"). This measures that on one CPU (`--cpu`, by
default the highest-numbered): a fixed piece of interpreter work (dicts, lists, small ints and a
struct pack, like a step's bookkeeping) timed beside one process spinning on each other CPU in
turn, then beside every other CPU spinning, each against the work alone timed just before it. A
CPU whose spinner slows the work well beyond the rest shares a core with it, whether or not the
kernel lists it as an SMT sibling (a guest often cannot see its host's threads); a slowdown with
every CPU busy but none alone is the machine's (shared caches, memory, clocks or the host under a
guest), and alone timings that drift from row to row are the host's too. Each figure is the
median of --repeats timings; the table also gives the CPU time the hypervisor stole from the
machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from radixserve.bench.common import print_table, write_json
from radixserve.bench.process import machine_cpu

SIBLINGS = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"  # e.g. "7,15" or "6-7"
SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
SETTLE_S = 0.1  # a new spinner's start-up, before the work is timed beside it


def _listed_siblings(cpu: int) -> set[int]:
    """The CPUs the kernel lists as sharing `cpu`'s core (none where it does not say)."""
    try:
        text = Path(SIBLINGS.format(cpu)).read_text().strip()
    except OSError:
        return set()
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus - {cpu}


def _work(rounds: int) -> float:
    """Seconds `rounds` passes of interpreter bookkeeping take on this thread."""
    start = time.perf_counter()
    for r in range(rounds):
        table = {i: i * 3 for i in range(64)}
        rows = [table[i] + r for i in range(64) if i & 1]
        struct.pack(f"{len(rows)}q", *rows)
    return time.perf_counter() - start


def _timed(rounds: int, repeats: int) -> float:
    return statistics.median(_work(rounds) for _ in range(repeats))


def _beside(cpus: list[int], rounds: int, repeats: int) -> float:
    """The work's median seconds while a process spins on each of `cpus`."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(c)]) for c in cpus]
    try:
        time.sleep(SETTLE_S * max(1, len(cpus) // 4))
        return _timed(rounds, repeats)
    finally:
        for s in spinners:
            s.kill()
        for s in spinners:
            s.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixserve bench cores", description=__doc__.split("\n")[0])
    p.add_argument("--cpu", type=int, default=None,
                   help="the CPU to time the work on (default: the highest-numbered one)")
    p.add_argument("--rounds", type=int, default=5000, help="passes of the work per timing")
    p.add_argument("--repeats", type=int, default=7, help="timings per figure (median)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    allowed = os.sched_getaffinity(0)
    cpu = args.cpu if args.cpu is not None else max(allowed)
    if cpu not in allowed:
        p.error(f"CPU {cpu} is not among this process's ({sorted(allowed)})")
    others = sorted(allowed - {cpu})
    os.sched_setaffinity(0, {cpu})
    _timed(args.rounds, 2)  # warm the interpreter's caches
    listed = _listed_siblings(cpu)
    stolen_before = machine_cpu()[1]
    began = time.perf_counter()
    rows = []
    # Each figure against the work alone just before it: a shared host's speed drifts by more
    # than one spinner moves it.
    for spun, label in [*(([o], str(o)) for o in others), (others, f"all {len(others)} others")]:
        alone = _timed(args.rounds, args.repeats)
        beside = _beside(spun, args.rounds, args.repeats)
        rows.append({"spinning on": label, "alone ms": alone * 1e3, "beside ms": beside * 1e3,
                     "factor": beside / alone,
                     "sibling": "listed" if label in map(str, listed) else ""})
    stolen = (machine_cpu()[1] - stolen_before) / (time.perf_counter() - began)
    print_table(f"interpreter work on CPU {cpu} ({args.rounds} rounds, median of "
                f"{args.repeats}), {len(allowed)} CPUs allowed; the machine's CPUs were "
                f"stolen {stolen:.3f} cores meanwhile", rows)
    write_json(args.json, {"cpu": cpu, "allowed": sorted(allowed), "listed_siblings":
                           sorted(listed), "stolen_cores": stolen, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
