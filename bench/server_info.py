"""What `radixserve bench serving` reads from GetServerInfo around a level: the prefix-cache totals
before and after it and, polled on the benchmark's own channel while it runs, the load of each
scheduler replica (data parallelism). A server that reports no replicas gets no replica rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from typing import Protocol

import grpc
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

POLL_INTERVAL_S = 0.5


class CacheTotals(Protocol):
    """GetServerInfoResponse and ReplicaInfo both count these since their start."""

    cached_tokens_total: int
    prompt_tokens_total: int


def cached_share(cached_tokens: int, prompt_tokens: int) -> float:
    """Share of prompt tokens served from the prefix cache; 0 when there were none."""
    return cached_tokens / prompt_tokens if prompt_tokens > 0 else 0.0


def totals_share(before: CacheTotals, after: CacheTotals) -> float:
    """cached_share of the tokens counted between two readings of the same totals."""
    return cached_share(after.cached_tokens_total - before.cached_tokens_total,
                        after.prompt_tokens_total - before.prompt_tokens_total)


@dataclass(frozen=True)
class ReplicaLoad:
    address: str
    state: str  # at the end of the level: "serving" or "unavailable"
    routed_requests: int  # sent to it during the level (completions)
    peak_running: int  # the most seen at one poll
    peak_waiting: int
    cached_share: float  # of the prompt tokens it took during the level


class ServerWatch:
    """`async with ServerWatch(stub) as w:` reads GetServerInfo on entry, every `interval_s` inside
    and on exit; then `w.first`, `w.last` and `w.replicas()` describe the span. A poll that fails
    inside the span is reported and skipped (the level goes on); one on entry or exit raises."""

    def __init__(self, stub: pb_grpc.GenerateServiceStub,
                 interval_s: float = POLL_INTERVAL_S) -> None:
        self._stub = stub
        self._interval_s = interval_s
        self._peaks: dict[str, tuple[int, int]] = {}  # address -> (running, waiting)
        self._task: asyncio.Task[None] | None = None
        self.first = pb.GetServerInfoResponse()
        self.last = pb.GetServerInfoResponse()
        self.failed_polls = 0

    async def __aenter__(self) -> ServerWatch:
        self.first = self.last = await self._poll()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None, "ServerWatch left without being entered"
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.last = await self._poll()

    async def _poll(self) -> pb.GetServerInfoResponse:
        info = await self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=30)
        for r in info.replicas:
            running, waiting = self._peaks.get(r.address, (0, 0))
            self._peaks[r.address] = (max(running, r.running_requests),
                                      max(waiting, r.waiting_requests))
        return info

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.last = await self._poll()
            except grpc.aio.AioRpcError as exc:
                self.failed_polls += 1
                if self.failed_polls == 1:
                    print(f"GetServerInfo poll failed ({exc.code().name}: {exc.details()}); "
                          f"replica peaks miss that moment", file=sys.stderr)

    @property
    def cached_share(self) -> float:
        return totals_share(self.first, self.last)

    def replicas(self) -> list[ReplicaLoad]:
        """Each replica of the last reading, against its first reading (zeros if it was new)."""
        before = {r.address: r for r in self.first.replicas}
        out = []
        for r in self.last.replicas:
            start = before.get(r.address, pb.ReplicaInfo())
            running, waiting = self._peaks[r.address]
            state = pb.ReplicaState.Name(r.state).removeprefix("REPLICA_STATE_").lower()
            out.append(ReplicaLoad(r.address, state, r.routed_requests - start.routed_requests,
                                   running, waiting, totals_share(start, r)))
        return out


def replica_table(loads: list[ReplicaLoad]) -> str:
    width = max([len("replica"), *(len(r.address) for r in loads)])
    head = (f"{'replica':<{width}} {'state':<11} {'routed':>6} {'peak run':>8} {'peak wait':>9} "
            f"{'cached':>6}")
    rows = [head, "-" * len(head)]
    rows += [f"{r.address:<{width}} {r.state:<11} {r.routed_requests:>6} {r.peak_running:>8} "
             f"{r.peak_waiting:>9} {r.cached_share:>6.3f}" for r in loads]
    return "\n".join(rows)
