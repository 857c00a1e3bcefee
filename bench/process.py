"""What the service benchmarks share: the stack they drive (--target, or `radixserve serve`
started under --launch), latency percentiles, and the RSS / open files of the four services.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

SERVICES = ("gateway", "tokenizer", "scheduler", "detokenizer")


# -- the stack -------------------------------------------------------------------------------------


def add_stack_args(p: argparse.ArgumentParser) -> None:
    """--target, --launch and --model: the stack a service benchmark drives."""
    p.add_argument("--target", default="127.0.0.1:50051", help="gateway address")
    p.add_argument("--launch", action="store_true",
                   help="start `radixserve serve` for the run (extra flags after --)")
    p.add_argument("--model", default="demo", help="model for --launch")


def parse_stack_args(p: argparse.ArgumentParser,
                     argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The parsed arguments and the flags after `--`, which only --launch may take (for `serve`)."""
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if extra and not args.launch:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return args, extra


@contextlib.contextmanager
def stack(args: argparse.Namespace,
          serve_flags: list[str]) -> Iterator[tuple[str, subprocess.Popen[bytes] | None]]:
    """(gateway address, the `serve` process or None): launched with `serve_flags` under --launch
    and stopped on the way out, else --target as given."""
    if not args.launch:
        yield args.target, None
        return
    with tempfile.TemporaryDirectory(prefix="radixserve-bench-") as scratch:
        proc, target = _launch(args.model, serve_flags, Path(scratch) / "ready")
        try:
            yield target, proc
        finally:
            proc.terminate()
            proc.wait(60)


def free_port_block(n: int) -> int:
    """The first of `n` consecutive ports that are free now, below the kernel's ephemeral range:
    serve gives its metrics ports one after another (gateways, then schedulers), and the ports the
    kernel hands out for port 0 (the public one here) are often only 2 apart."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 30000 - n)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + n):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise SystemExit(f"no {n} consecutive free ports between 20000 and 30000")


def _launch(model: str, extra: list[str],
            ready_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start `radixserve serve` on a free port and wait until every child is ready (`ready_file`
    appears: with several gateways on the port a health check reaches only one of them) and the
    gateway is SERVING with every scheduler replica (it serves as soon as one is: a level must not
    start on part of them)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from radixserve.v1 import generate_pb2 as pb
    from radixserve.v1 import generate_pb2_grpc as pb_grpc

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "radixserve.services.cli", "serve", "--model", model,
            "--port", str(port), "--log-level", "WARNING", "--ready-file", str(ready_file), *extra]
    proc = subprocess.Popen(argv)
    target = f"127.0.0.1:{port}"
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"radixserve serve exited with {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING and ready_file.exists():
                    info = pb_grpc.GenerateServiceStub(channel).GetServerInfo(
                        pb.GetServerInfoRequest(), timeout=5)
                    if all(r.state == pb.REPLICA_STATE_SERVING for r in info.replicas):
                        return proc, target
            except grpc.RpcError:
                pass  # not listening yet
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit("radixserve serve did not become ready")


def percentiles(values: list[float]) -> dict[str, float]:
    """Mean, p50 and p99 of `values`, times 1000 (seconds in, milliseconds out)."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000

    return {"mean": statistics.fmean(ordered) * 1000, "p50": pick(0.5), "p99": pick(0.99)}


# -- process sampling (psutil when installed, else /proc) -----------------------------------------


def service_pids(serve_pid: int) -> dict[str, int]:
    """The children of a `radixserve serve` process, by service name; a second process of one
    service (several gateways, replicas) is NAME-2, a third NAME-3, and so on. A gateway with a
    probe socket of its own (several gateways, TLS) is named after it, as `serve` names it
    (gateway-0, gateway-1, ...): the name then stays with the gateway when it is replaced."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != serve_pid:
            continue
        words = [w.decode(errors="replace") for w in argv]
        if "gateway" in words and "--probe-address" in words[:-1]:
            found[Path(words[words.index("--probe-address") + 1]).stem] = int(entry.name)
            continue
        for name in SERVICES:
            if name in words:
                key, k = name, 1
                while key in found:
                    k += 1
                    key = f"{name}-{k}"
                found[key] = int(entry.name)
    return dict(sorted(found.items()))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far, all its threads."""
    fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """(busy, stolen): CPU seconds of the whole machine so far, summed over its CPUs (/proc/stat).
    Stolen is time a virtual CPU had work but the hypervisor ran something else: on a shared host
    every thread of ours stalls for it, whatever our code does."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def sample(pid: int) -> dict[str, float]:
    """RSS in MiB and open file descriptors of `pid` (an OSError once it has exited)."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return {"rss_mib": proc.memory_info().rss / 2**20, "fds": float(proc.num_fds())}
    except ImportError:
        pass
    except psutil.NoSuchProcess as exc:  # the same error as reading /proc of a process gone
        raise ProcessLookupError(f"process {pid} has exited") from exc
    rss_kib = 0
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    return {"rss_mib": rss_kib / 1024, "fds": float(len(os.listdir(f"/proc/{pid}/fd")))}


def process_changes(pids: dict[str, int], before: dict[str, dict[str, float]],
                    skip: tuple[str, ...] = ()) -> dict[str, dict[str, float]]:
    """RSS and fds of each service now against `before` (from `sample`); `skip` the dead ones."""
    out = {}
    for name, pid in pids.items():
        if name not in skip:
            after = sample(pid)
            out[name] = {"rss_before_mib": before[name]["rss_mib"],
                         "rss_after_mib": after["rss_mib"],
                         "fds_before": before[name]["fds"], "fds_after": after["fds"]}
    return out


class RssSeries:
    """Each service's RSS sampled every `every_s` while a load runs, and its growth as a
    least-squares slope over the samples taken `warmup_s` or more after the first: the prefix
    cache and the allocators fill during the first minutes, a leak keeps growing after them.

    A service whose process is replaced on a schedule (a recycled gateway) draws a saw: each
    process grows from a fresh start until it retires. A line through the saw takes its sign from
    where the run cuts it, so such a service is fitted through the peak of each process life
    that ended during the load; a leak that outlives a process (shared state, a file) raises
    the peaks."""

    def __init__(self, pids: dict[str, int], every_s: float, warmup_s: float,
                 resolve: Callable[[], dict[str, int]] | None = None):
        """`resolve`: the services' pids now, looked up again at every sample, so a service
        whose process is replaced (a recycled gateway) is followed to the new one."""
        self.pids = pids
        self.every_s = every_s
        self.warmup_s = warmup_s
        self.resolve = resolve
        # per service: (seconds since the sampling began, RSS in MiB, pid)
        self.samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in pids}

    async def run(self) -> None:
        """Sample until cancelled (without `resolve`, a dead service stops being sampled; with
        it, a service between two processes misses that sample)."""
        start = time.monotonic()
        alive = dict(self.pids)
        while alive or self.resolve is not None:
            now = time.monotonic() - start
            if self.resolve is not None:
                alive = self.resolve()
            for name, pid in list(alive.items()):
                try:
                    self.samples.setdefault(name, []).append(
                        (now, sample(pid)["rss_mib"], pid))
                except OSError:  # it exited (the check after the load reports that)
                    del alive[name]
            await asyncio.sleep(self.every_s)

    def growth(self) -> dict[str, dict[str, float]]:
        """Per service: samples after the warm-up, their RSS range (MiB), the slope in MiB and in
        percent of the fitted points' mean per hour, and `lives`, the processes seen after the
        warm-up. With more than one, the slope is fitted to the peaks of the lives that ended
        (`fitted` is how many), else to every sample. A service with fewer than 3 points to fit
        is left out (no slope)."""
        out = {}
        for name, points in self.samples.items():
            kept = [(t, rss, pid) for t, rss, pid in points if t >= self.warmup_s]
            lives = _lives(kept)
            fit = ([max(life, key=lambda p: p[1])[:2] for life in lives[:-1]] if len(lives) > 1
                   else [(t, rss) for t, rss, _ in kept])
            if len(fit) < 3:
                continue
            slope = statistics.linear_regression(*zip(*fit)).slope * 3600  # least squares
            mean = statistics.fmean(rss for _, rss in fit)
            out[name] = {"samples": float(len(kept)), "rss_min_mib": min(r for _, r, _ in kept),
                         "rss_max_mib": max(r for _, r, _ in kept), "lives": float(len(lives)),
                         "fitted": float(len(fit)), "mib_per_h": slope,
                         "pct_per_h": 100 * slope / mean}
        return out


def _lives(points: list[tuple[float, float, int]]) -> list[list[tuple[float, float, int]]]:
    """`points` (time-ordered, with a pid each) cut into runs of one process."""
    lives: list[list[tuple[float, float, int]]] = []
    for point in points:
        if not lives or lives[-1][-1][2] != point[2]:
            lives.append([])
        lives[-1].append(point)
    return lives


def growth_table(growth: dict[str, dict[str, float]], warmup_s: float) -> list[str]:
    """The markdown rows of `RssSeries.growth` (none when nothing was sampled long enough)."""
    if not growth:
        return []
    return ["", f"| service | RSS samples after {warmup_s:.0f} s | RSS range (MiB) | fitted to | "
            "growth (MiB/h) | growth (%/h) |", "|---|---:|---|---|---:|---:|",
            *(f"| {name} | {g['samples']:.0f} | {g['rss_min_mib']:.1f}-{g['rss_max_mib']:.1f} | "
              f"{_fitted(g)} | {g['mib_per_h']:+.2f} | {g['pct_per_h']:+.2f} |"
              for name, g in growth.items())]


def _fitted(g: dict[str, float]) -> str:
    if g["lives"] > 1:
        return f"peaks of {g['fitted']:.0f} ended lives (of {g['lives']:.0f} processes)"
    return "every sample"


def process_table(processes: dict[str, dict[str, float]]) -> list[str]:
    """The markdown rows of `process_changes`' result (none when no services were sampled)."""
    if not processes:
        return []
    return ["", "| service | RSS before (MiB) | RSS after (MiB) | fds before | fds after |",
            "|---|---|---|---|---|",
            *(f"| {name} | {p['rss_before_mib']:.0f} | {p['rss_after_mib']:.0f} | "
              f"{p['fds_before']:.0f} | "
              f"{p['fds_after']:.0f} |" for name, p in processes.items())]


async def wait_idle(stub: pb_grpc.GenerateServiceStub,
                    timeout_s: float) -> tuple[bool, dict[str, int]]:
    """(idle, GetServerInfo's integer fields): idle once nothing runs or waits, every KV page is
    free or evictable and neither the gateway nor the detokenizer holds a request; polled until
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        fields = {f.name: getattr(info, f.name) for f in info.DESCRIPTOR.fields
                  if isinstance(getattr(info, f.name), int)}
        idle = (info.running_requests == 0 and info.waiting_requests == 0
                and info.kv_pages_free + info.kv_pages_evictable == info.kv_pages_total
                and info.gateway_live_requests == 0 and info.detokenizer_live_requests == 0)
        if idle or time.monotonic() > deadline:
            return idle, fields
        await asyncio.sleep(0.1)


def raise_fd_limit() -> None:
    """Soft open-file limit up to the hard one, for this process and a --launch'ed stack (which
    inherits it): a thousand clients must not fail on a 1024 default."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
