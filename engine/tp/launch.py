"""Rank 0's side of a tensor-parallel engine: spawn the follower ranks, build the communicator
and the control channel with them, send each step's plan, and watch them. Followers run
`radixserve.engine.tp.worker`.

Start-up: rank 0 opens a TCP store on a free localhost port (port 0, so no race for it), spawns
ranks 1..N-1 with the store's port and their config as JSON, waits until each has reached the
store (noticing one that died first), then all ranks build the communicator and open the control
channel, and build their engine shards; each worker then marks itself ready in the store. Each
worker's stdin is a pipe from rank 0: when rank 0 exits, however it exits, the pipe closes and the
worker leaves. From the channel on, a watchdog (watchdog.py) turns a follower that exits or stops
into a TPGroupError naming it.
"""

from __future__ import annotations

import datetime
import json
import logging
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

import torch
import torch.distributed as dist
from radixserve.engine.config import EngineConfig
from radixserve.engine.distributed import (
    CollectiveGuard,
    CommSetup,
    SingleRankComm,
    TPGroupError,
    comm_scope,
    create_comm,
)
from radixserve.engine.kvcache.table import TableManager
from radixserve.engine.models.config import ModelArgs
from radixserve.engine.scheduler.batch import Batch
from radixserve.engine.tp.channel import open_channel
from radixserve.engine.tp.plan import PlanEncoder
from radixserve.engine.tp.watchdog import Watchdog

log = logging.getLogger(__name__)
STORE_HOST = "127.0.0.1"
EXIT_GRACE_S = 10.0  # how long close() lets workers leave before killing them
FAILED_GRACE_S = 1.0  # the same after a group failure, when a worker may be stuck for good
# workers import, join and load their shard within this (deaths show at once)
START_TIMEOUT_S = 600.0


def check_tp_shapes(args: ModelArgs, tp_size: int) -> None:
    """Reject a model whose sharded dimensions do not split evenly over `tp_size` ranks."""
    problems = []
    if args.num_heads % tp_size:
        problems.append(f"num_attention_heads ({args.num_heads}) is not divisible by it")
    kv = args.num_kv_heads
    if kv % tp_size and tp_size % kv:
        problems.append(f"num_key_value_heads ({kv}) is neither a multiple nor a divisor of it")
    if args.intermediate_size % tp_size:
        problems.append(f"intermediate_size ({args.intermediate_size}) is not divisible by it")
    if problems:
        raise ValueError(
            f"{args.architecture} cannot be split over tp_size={tp_size}: " + "; ".join(problems))


def rank_device(device: torch.device, rank: int, tp_size: int) -> torch.device:
    """Rank r of a GPU group uses cuda:r; CPU ranks share the host."""
    if device.type != "cuda":
        return device
    if torch.cuda.device_count() < tp_size:
        raise ValueError(f"tp_size={tp_size} needs {tp_size} GPUs; {torch.cuda.device_count()} "
                         "visible")
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def _stop_workers(workers: list[subprocess.Popen], grace_s: float,
                  closers: list[Callable[[], None]] | None = None) -> None:
    """Close the workers' pipes, wait up to `grace_s` for them, kill the rest; then run `closers`
    (rank 0's channel and communicator, released once no worker uses them)."""
    for p in workers:
        if p.stdin is not None and not p.stdin.closed:
            p.stdin.close()  # the worker's watchdog sees EOF and exits
    deadline = time.monotonic() + grace_s
    for p in workers:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for close in closers or []:
        close()


_current: weakref.ref[TPLeader] | None = None  # this process's TP engine, the one it may hold


def _claim_process(leader: TPLeader) -> None:
    """torch.distributed has one default group per process, so one TP engine at a time: refuse a
    second while the first is open, before any worker is spawned."""
    global _current
    other = _current() if _current is not None else None
    if other is not None and not other.closed:
        raise RuntimeError(
            f"a tensor-parallel engine (tp_size={other.tp_size}) is already running in this "
            "process, and there can be one at a time: close it first (LLM.close() or "
            "EngineCore.close(), or build it in a `with LLM(...)` block), or run the second "
            "engine in a process of its own")
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process (not by a "
                           "radixserve engine); a tensor-parallel engine needs the process's "
                           "default group: run it in a process of its own")
    _current = weakref.ref(leader)


class TPLeader:
    """Rank 0 of a TP group: owns the worker processes, the communicator and the plan channel."""

    def __init__(self, config: EngineConfig, args: ModelArgs, device: torch.device) -> None:
        if config.tp_rank != 0:
            raise ValueError("EngineCore runs TP rank 0; ranks 1..N-1 are spawned by it")
        check_tp_shapes(args, config.tp_size)
        self.tp_size, self.timeout_s = config.tp_size, config.tp_timeout_s
        self.device = rank_device(device, 0, self.tp_size)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self.store = dist.TCPStore(STORE_HOST, 0, self.tp_size, is_master=True, timeout=timeout,
                                   wait_for_workers=False)
        self.closed = False
        _claim_process(self)
        # What a core that is never closed releases when collected or at exit (filled as built).
        self.workers: list[subprocess.Popen] = []
        self._closers: list[Callable[[], None]] = []
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, FAILED_GRACE_S,
                                           self._closers)
        try:
            self.workers += [self._spawn(config, r) for r in range(1, self.tp_size)]
            self._wait_for("joined")
            self.guard = CollectiveGuard(0, self.describe_workers)
            self.comm = create_comm(config.tp_comm, CommSetup(0, self.tp_size, self.device,
                                                              self.store, self.timeout_s,
                                                              self.guard))
            self._closers.append(self.comm.close)
            self.channel = open_channel(config.tp_control, 0, self.tp_size, self.store,
                                        self.guard)
            self._closers.insert(0, self.channel.close)
        except BaseException:
            self.closed = True  # a traceback may keep this object alive; it holds nothing now
            self._finalizer()
            raise
        self.watchdog = Watchdog(self.workers, self.channel, self.guard, self.comm)
        self.watchdog.start()
        self.encoder = PlanEncoder()

    def _spawn(self, config: EngineConfig, rank: int) -> subprocess.Popen:
        cfg = json.dumps(asdict(replace(config, tp_rank=rank)))
        cmd = [sys.executable, "-m", "radixserve.engine.tp.worker", "--rank", str(rank),
               "--store", f"{STORE_HOST}:{self.store.port}", "--config", cfg]
        return subprocess.Popen(cmd, stdin=subprocess.PIPE)

    def _wait_for(self, stage: str) -> None:
        """Wait until every worker has set `{stage}/{rank}` in the store; fail fast if one dies."""
        keys = [f"{stage}/{r}" for r in range(1, self.tp_size)]
        limit = max(START_TIMEOUT_S, self.timeout_s)
        deadline = time.monotonic() + limit
        while not self.store.check(keys):
            dead = [(r, p.returncode) for r, p in enumerate(self.workers, 1)
                    if p.poll() is not None]
            if dead:
                raise TPGroupError(f"TP worker(s) exited before being {stage} (rank, exit code): "
                                   f"{dead}")
            if time.monotonic() > deadline:
                raise TPGroupError(f"TP workers were not {stage} within {limit:.0f} s")
            time.sleep(0.05)

    def wait_ready(self) -> None:
        """Every worker has built its engine shard."""
        self._wait_for("ready")

    def describe_workers(self) -> str:
        """What the watchdog found, else which workers have exited, waiting briefly for a dying
        one to be reaped."""
        watchdog = getattr(self, "watchdog", None)  # None while the group is being joined
        if watchdog is not None and watchdog.diagnosis is not None:
            return watchdog.diagnosis
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and all(p.poll() is None for p in self.workers):
            time.sleep(0.05)
        dead = [f"worker rank {r} exited with code {p.returncode}"
                for r, p in enumerate(self.workers, 1) if p.poll() is not None]
        return "; ".join(dead) or ("no worker exited, one may be stuck (timeout "
                                   f"{self.timeout_s:.0f} s)")

    def check(self) -> None:
        """Raise the group's failure, if any (e.g. after waiting for a step's results: under NCCL
        the watchdog's abort is what ended that wait)."""
        self.guard.check()

    def send_plan(self, batch: Batch, table: TableManager) -> None:
        """Send the step about to run; call between scheduling and `ModelRunner.forward`."""
        self.channel.send(self.encoder.encode(batch, table))

    def close(self) -> None:
        """Tell the workers to leave, wait for them (killing stragglers), and leave the groups."""
        if self.closed:
            return
        self.closed = True
        self.watchdog.stop()
        healthy = self.guard.failure is None
        if healthy:
            try:
                self.channel.send(self.encoder.encode_shutdown())
            except TPGroupError as e:
                healthy = False
                log.warning("could not send the shutdown plan: %s", e)
        self._finalizer.detach()
        _stop_workers(self.workers, EXIT_GRACE_S if healthy else FAILED_GRACE_S, self._closers)


@contextmanager
def building(leader: TPLeader | None) -> Iterator[None]:
    """Build rank 0's engine with the group's communicator; then wait until every rank is ready.
    If anything fails, the workers are taken down before the error propagates."""
    if leader is None:
        with comm_scope(SingleRankComm()):
            yield
        return
    try:
        with comm_scope(leader.comm):
            yield
        leader.wait_ready()
    except BaseException:
        leader.close()
        raise
