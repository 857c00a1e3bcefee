"""One scheduler replica as the gateway sees it: its Submit stream, its health, its load.

A replica is *routable* while its Submit stream is up, its health says SERVING, it serves the same
model as the others, and the detokenizer it streams to has this gateway subscribed (else its
outputs would be lost). Going NOT_SERVING (a draining scheduler) only stops new work: requests
already there keep streaming. Losing the Submit stream (the process died, the host went away)
fails every request it held, with UNAVAILABLE, through `on_lost`; the other replicas are untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2_grpc
from radixserve.internal.scheduler.v1 import scheduler_pb2_grpc as sched_grpc
from radixserve.services.common import rpc
from radixserve.services.common.errors import RETRY_AFTER_MS
from radixserve.services.gateway import convert
from radixserve.services.gateway.streams import Outbox, end_session, first_exit, reconnect_forever
from radixserve.services.gateway.types import Acks, ModelInfo, ReplicaReport, ReplicaStats

log = logging.getLogger(__name__)
STATS_INTERVAL_S = 0.5  # load polls per replica, for routing and GetServerInfo


class ReplicaEvents:
    """What a replica tells the gateway (all called on the event loop)."""

    def on_acks(self, acks: Acks) -> None: ...
    def on_aborts_sent(self, waited_s: list[float]) -> None:
        """Aborts went out on the Submit stream, each `waited_s` after it was asked for."""
    def on_lost(self, replica: SchedulerReplica, message: str) -> None: ...
    def on_change(self, replica: SchedulerReplica) -> None: ...
    def admits(self, replica: SchedulerReplica, info: ModelInfo) -> str | None:
        """None to admit a replica serving `info`, else why not."""


class _Abort(NamedTuple):
    rid: str
    at: float  # when it was asked for (time.perf_counter())


class SchedulerReplica:
    def __init__(
        self,
        address: str,
        events: ReplicaEvents,
        subscribed: Callable[[], bool],
        metadata: tuple[tuple[str, str], ...] = (),
        retry_s: float = 0.5,
        stats_interval_s: float = STATS_INTERVAL_S,
    ) -> None:
        self.address = address
        self._events = events
        self._subscribed = subscribed  # is this gateway subscribed to its detokenizer?
        self._md = metadata
        self._retry_s = retry_s
        self._stats_interval_s = stats_interval_s
        self._submits: Outbox[list[Message] | _Abort] = Outbox()
        self.model_info: ModelInfo | None = None
        self.connected = False  # Submit stream up (requests sent now reach it)
        self.health_serving = False
        self.stats: ReplicaStats | None = None
        self._in_flight_at_poll = 0
        self.in_flight = 0  # completions of this gateway it holds (kept by the frontend)
        self.routed = 0
        # (in_flight, when, n) at its last "queue full" answer to a call of n completions.
        self._full: tuple[int, float, int] | None = None
        self._stub: Any = None

    # -- routing ---------------------------------------------------------------------------------
    @property
    def routable(self) -> bool:
        return self.connected and self.health_serving and self._subscribed()

    @property
    def load(self) -> int:
        """Running + waiting requests: the last poll's count from all gateways, with this
        gateway's part brought up to date (requests sent or ended since the poll)."""
        if self.stats is None:
            return self.in_flight
        polled = self.stats.running_requests + self.stats.waiting_requests
        return max(0, polled - self._in_flight_at_poll) + self.in_flight

    def refuses(self, n: int) -> bool:
        """Whether a call of n completions would be refused "queue full" now, without asking.
        Only one of its requests ending can make room, so the hint holds until then, or until the
        retry-after time (other gateways' requests may end too)."""
        if self._full is None:
            return False
        held, when, full_n = self._full
        if self.in_flight < held or time.monotonic() - when >= RETRY_AFTER_MS / 1000:
            self._full = None
            return False
        return n >= full_n

    def mark_full(self, n: int) -> None:
        """It answered "queue full" to a call of n completions (still counted in in_flight)."""
        self._full = (self.in_flight - n, time.monotonic(), n)

    def report(self) -> ReplicaReport:
        return ReplicaReport(self.address, self.routable, self.stats, self.routed, self.in_flight)

    # -- requests --------------------------------------------------------------------------------
    def submit(self, requests: list[Message]) -> None:
        """Queue one Generate call's requests (a group goes in one message: scheduler/groups.py)."""
        self.routed += len(requests)
        self._submits.put(requests)

    def abort(self, rid: str) -> None:
        self._submits.put(_Abort(rid, time.perf_counter()))

    # -- connection lifecycle --------------------------------------------------------------------
    async def run(self) -> None:
        async with rpc.internal_channel(self.address) as channel:
            self._stub = sched_grpc.SchedulerServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            await reconnect_forever(f"scheduler {self.address}",
                                    lambda: self._session(health), self._retry_s)

    async def _session(self, health: health_pb2_grpc.HealthStub) -> None:
        call: grpc.aio.StreamStreamCall | None = None
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._wait_serving(health)
            call = self._stub.Submit(metadata=self._md)
            await call.wait_for_connection()
            self._submits.clear()  # aborts queued while it was away name requests it never had
            tasks = [asyncio.create_task(coro) for coro in (
                self._pump(call), self._read_acks(call), self._watch(health), self._poll())]
            self._set(connected=True, health_serving=True)
            log.info("scheduler %s connected", self.address)
            await first_exit(tasks)
        finally:
            end_session(tasks, call)
            was_connected = self.connected
            self._set(connected=False, health_serving=False)
            self.stats, self._full = None, None
            if was_connected:
                self._events.on_lost(self, f"scheduler replica {self.address} is unavailable")

    async def _wait_serving(self, health: health_pb2_grpc.HealthStub) -> None:
        """Until it answers SERVING with a model this gateway may route to."""
        while True:
            try:
                await rpc.require_serving(health)
                model, _ = convert.model_info_requests()
                reply = await self._stub.GetModelInfo(model, timeout=5.0, metadata=self._md)
                info = convert.model_info_from_pb(reply)
                refusal = self._events.admits(self, info)
                if refusal is None:
                    self.model_info = info
                    return
                log.error("scheduler %s not used: %s", self.address, refusal)
            except (grpc.aio.AioRpcError, rpc.NotServing) as exc:
                log.debug("scheduler %s not ready yet: %s", self.address, exc)
            await asyncio.sleep(self._retry_s)

    async def _pump(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            batch = await self._submits.take_batch()
            aborts = [item for item in batch if isinstance(item, _Abort)]
            await call.write(convert.submit_to_pb(
                [r for item in batch if not isinstance(item, _Abort) for r in item],
                [a.rid for a in aborts],
            ))
            if aborts:
                now = time.perf_counter()
                self._events.on_aborts_sent([now - a.at for a in aborts])

    async def _read_acks(self, call: grpc.aio.StreamStreamCall) -> None:
        async for response in call:
            self._events.on_acks(convert.acks_from_pb(response))

    async def _watch(self, health: health_pb2_grpc.HealthStub) -> None:
        """Follow its health: NOT_SERVING (draining, shutting down) stops new work only. A broken
        watch counts as NOT_SERVING until it is back; the Submit stream alone decides a loss."""
        while True:
            try:
                async for serving in rpc.watch_serving(health):
                    if serving != self.health_serving:
                        log.info("scheduler %s %s", self.address,
                                 "serving" if serving else "not serving")
                        self._set(health_serving=serving)
            except grpc.aio.AioRpcError as exc:
                log.warning("scheduler %s: health watch failed: %s", self.address, exc.code().name)
            self._set(health_serving=False)
            await asyncio.sleep(self._retry_s)

    async def refresh(self) -> ReplicaReport:
        """Ask for its counters now (GetServerInfo must not report a poll's stale totals); a
        slow or failed answer keeps the last ones."""
        if self.connected and self._stub is not None:
            request, _ = convert.stats_requests()
            in_flight = self.in_flight
            try:
                reply = await self._stub.GetStats(request, timeout=5.0, metadata=self._md)
            except grpc.aio.AioRpcError as exc:
                log.debug("scheduler %s: stats failed: %s", self.address, exc.code().name)
            else:
                if self.connected:  # not lost while it answered
                    self.stats = convert.replica_stats_from_pb(reply)
                    self._in_flight_at_poll = in_flight
        return self.report()

    async def _poll(self) -> None:
        """Its load, for routing."""
        while True:
            await self.refresh()
            await asyncio.sleep(self._stats_interval_s)

    def _set(self, **flags: bool) -> None:
        before = self.routable
        for name, value in flags.items():
            setattr(self, name, value)
        if self.routable != before:
            self._events.on_change(self)
