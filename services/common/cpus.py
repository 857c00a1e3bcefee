"""CPUs of their own for the engine threads (`serve --engine-cpus`).

A served GPU engine is paced by one Python thread: each step's host work (schedule, upload,
launch) runs on the scheduler's engine loop thread while the device runs the step before. That
thread's work takes two to three times as long when the rest of the machine is busy as when it is
alone (docs/benchmarks.md, "GPU, twenty-ninth round"): other threads that the kernel places on its
CPU, or on that CPU's SMT sibling, share the core's caches and pipelines with it, and each move
to another CPU leaves its caches behind.

A plan gives each replica's engine thread a CPU of its own and keeps everything else of the stack
off it and off its SMT siblings (the `reserved` CPUs):

- the supervisor pins itself to the `rest` before it starts any child, so every service process,
  and every thread they start, inherits the rest;
- each scheduler's engine loop thread pins itself to its CPU once its engine is built (the CUDA
  driver's threads, started while building, keep the rest);
- a load generator on the same machine can read the supervisor's CPUs (`os.sched_getaffinity` of
  its pid) and keep to them too (`radixserve bench serving --launch` does).

`auto` takes the highest-numbered CPUs the process may use (CPU 0 often takes the machine's
interrupts), one a replica, with their siblings as the sysfs topology lists them, and only where
at least `MIN_REST` CPUs are left for the rest; an explicit list names replica i's CPU at
position i. Tensor-parallel follower ranks are processes of their own and stay on the rest.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SIBLINGS_PATH = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"
MIN_REST = 4  # CPUs `auto` leaves for the services, their gRPC threads and the driver's
CPU_SPECS = ("off", "auto")  # besides a list of CPU ids


@dataclass(frozen=True)
class CpuPlan:
    engines: tuple[int, ...]  # replica i's engine thread runs on CPU engines[i]
    reserved: frozenset[int]  # the engines' CPUs and their SMT siblings: nothing else runs there
    rest: frozenset[int]  # every other CPU the stack may use


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7], the kernel's list format (taskset -c, sysfs)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part.strip():
            continue
        first, _, last = part.partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"not a CPU list: {text!r} (e.g. 7 or 6,7 or 0-3)") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"not a CPU range: {part!r} in {text!r}")
        cpus += range(lo, hi + 1)
    return cpus


def format_cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def smt_siblings(cpu: int) -> frozenset[int]:
    """`cpu` and the CPUs that share its core, as the kernel lists them; {cpu} where it does
    not (a guest is often shown one thread per core whatever the host runs under it)."""
    try:
        listed = Path(SIBLINGS_PATH.format(cpu)).read_text()
    except OSError:
        return frozenset({cpu})
    return frozenset(parse_cpu_list(listed)) | {cpu}


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (taskset, cgroups)."""
    return frozenset(os.sched_getaffinity(0))


def plan_cpus(spec: str, replicas: int, allowed: frozenset[int],
              siblings: Callable[[int], frozenset[int]] = smt_siblings) -> CpuPlan | None:
    """The plan `spec` ('off', 'auto' or a CPU list) gives `replicas` engine threads within
    `allowed`; None for off, and for auto where too few CPUs would be left. ValueError for a list
    that does not fit (a CPU not allowed, one reused, fewer than the replicas, nothing left)."""
    spec = spec.strip()
    if spec == "off":
        return None
    if spec == "auto":
        engines: list[int] = []
        reserved: set[int] = set()
        for cpu in sorted(allowed, reverse=True):
            if len(engines) == replicas:
                break
            if cpu not in reserved:
                engines.append(cpu)
                reserved |= siblings(cpu) & allowed
        rest = allowed - reserved
        if len(engines) < replicas or len(rest) < MIN_REST:
            log.info("engine CPUs: off (%d CPUs allowed: too few to give %d engine thread(s) "
                     "their own and leave %d)", len(allowed), replicas, MIN_REST)
            return None
        return CpuPlan(tuple(engines), frozenset(reserved), frozenset(rest))
    listed = parse_cpu_list(spec)
    if len(listed) != replicas or len(set(listed)) != len(listed):
        raise ValueError(f"--engine-cpus {spec!r}: give one distinct CPU per scheduler replica "
                         f"({replicas}), or 'auto' or 'off'")
    outside = sorted(set(listed) - allowed)
    if outside:
        raise ValueError(f"--engine-cpus {spec!r}: CPU(s) {format_cpu_list(outside)} not among "
                         f"this process's ({format_cpu_list(allowed)})")
    taken = set().union(*(siblings(c) & allowed for c in listed)) | set(listed)
    rest = allowed - taken
    if not rest:
        raise ValueError(f"--engine-cpus {spec!r} (with SMT siblings "
                         f"{format_cpu_list(taken)}) leaves no CPU for the other services")
    return CpuPlan(tuple(listed), frozenset(taken), frozenset(rest))


def pin_this_thread(cpus: Iterable[int]) -> None:
    """Run the calling thread (only it: Linux applies an affinity to one thread) on `cpus`;
    threads it starts afterwards inherit them. ValueError naming them where the kernel refuses
    (a CPU this machine, or its cgroup, does not have)."""
    try:
        os.sched_setaffinity(0, set(cpus))
    except OSError as exc:
        raise ValueError(f"cannot run on CPUs {format_cpu_list(cpus)}: {exc.strerror}") from exc
