"""gRPC server of the scheduler service (radixserve.internal.scheduler.v1)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import grpc
from radixserve.internal.scheduler.v1 import scheduler_pb2 as pb
from radixserve.internal.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from radixserve.services.common import auth, rpc
from radixserve.services.common.errors import ErrorInterceptor, unavailable
from radixserve.services.common.lifecycle import freeze_startup_objects
from radixserve.services.scheduler import convert
from radixserve.services.scheduler.compile import GrammarCompiler, split
from radixserve.services.scheduler.groups import Refused, screen
from radixserve.services.scheduler.link import DetokenizerLink
from radixserve.services.scheduler.loop import EngineLike, EngineLoop, LoopConfig
from radixserve.services.scheduler.types import (
    AbortOwned,
    Acks,
    Incoming,
    Invalid,
    NewRequest,
    Rejection,
    StepBatch,
    Submission,
)

log = logging.getLogger(__name__)
# Python's thread switch interval in the scheduler process (see `serve`).
ENGINE_SWITCH_INTERVAL_S = 0.0005
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SchedulerService"].full_name


class SchedulerApp:
    """Owns the engine loop, the detokenizer link and readiness; the loop's `LoopSink`."""

    def __init__(
        self,
        engine_factory: Callable[[], EngineLike],
        detokenizer_address: str,
        loop_config: LoopConfig | None = None,
        secret: str | None = None,
    ) -> None:
        self._aio = asyncio.get_running_loop()
        self.secret = secret
        self.loop = EngineLoop(engine_factory, self, loop_config or LoopConfig())
        self.link = DetokenizerLink(
            detokenizer_address, self._on_stop_aborts, self._on_link, auth.call_metadata(secret)
        )
        self.health: rpc.Health | None = None
        self.fatal = asyncio.Event()
        self.model_ready = False
        # Freeze what loading the model built out of the garbage collector once it is ready
        # (lifecycle.freeze_startup_objects); the service's entry point sets it, an app run
        # inside another process (tests) leaves that process's collector alone.
        self.freeze_when_ready = False
        self.draining = False
        self.stalled = False  # the engine loop has not moved for half the watchdog time
        self._gateways: dict[int, asyncio.Queue[pb.SubmitResponse | None]] = {}
        self._link_task: asyncio.Task[None] | None = None
        # Constrained requests wait here for their grammar (compile.py); the engine exists by the
        # time one is accepted, since nothing is accepted before the model is ready.
        self.compiler = GrammarCompiler(
            lambda params: self.loop.engine.compile_grammar(params),  # type: ignore[union-attr]
            lambda owner, reqs: self.loop.submit(Submission(owner, reqs)),
            lambda owner, rejected: self.on_acks(Acks(owner, [], rejected)),
        )

    @property
    def accepting(self) -> bool:
        return self.model_ready and self.link.connected and not self.draining and not self.stalled

    def start(self) -> None:
        self.loop.start()
        self._link_task = asyncio.create_task(self.link.run())

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests, let running ones finish (up to `timeout_s`), then stop the loop."""
        self.draining = True
        if self.health is not None:
            await self.health.shutdown()
        deadline = time.monotonic() + timeout_s
        while ((self.loop.live_requests or len(self.compiler)) and not self.fatal.is_set()
               and time.monotonic() < deadline):
            await asyncio.sleep(0.05)
        self.compiler.close()
        # After a fatal error the loop thread is dead or hung: do not wait for it.
        await asyncio.to_thread(self.loop.stop, 0.5 if self.fatal.is_set() else 10.0)
        if self._link_task is not None:
            self._link_task.cancel()

    # -- LoopSink: called on the engine thread -------------------------------------------------
    def on_ready(self, model_info: Any) -> None:
        self._aio.call_soon_threadsafe(self._set_ready)

    def on_acks(self, acks: Acks) -> None:
        msg = convert.acks_to_pb(acks)
        self._aio.call_soon_threadsafe(self._deliver_acks, acks.owner, msg)

    def on_step(self, batch: StepBatch) -> None:
        # The protobuf is built on the event loop, not here: the engine thread goes straight on to
        # the next step, and the conversion runs while that step waits for the device.
        self._aio.call_soon_threadsafe(self._send_step, batch)

    def on_fatal(self, exc: BaseException) -> None:
        self._aio.call_soon_threadsafe(self.fatal.set)

    def on_stalled(self, stalled: bool) -> None:
        self._aio.call_soon_threadsafe(self._set_stalled, stalled)

    # -- event loop side ------------------------------------------------------------------------
    def _set_ready(self) -> None:
        if self.freeze_when_ready:
            freeze_startup_objects()
        self.model_ready = True
        log.info("model loaded and warmed up")
        self._aio.create_task(self._update_health())

    def _send_step(self, batch: StepBatch) -> None:
        if self.link.connected:  # while the link is down its steps are dropped anyway
            self.link.send(convert.step_to_pb(batch))

    def _on_link(self, connected: bool) -> None:
        log.info("detokenizer link %s", "up" if connected else "down")
        if not connected:
            self.compiler.abort_owned(None)
            self.loop.submit(AbortOwned(None))  # their outputs have nowhere to go
        self._aio.create_task(self._update_health())

    def _on_stop_aborts(self, rids: list[str]) -> None:
        self.loop.submit(Submission(owner=None, abort_ids=rids))

    def _deliver_acks(self, owner: Any, msg: pb.SubmitResponse) -> None:
        queue = self._gateways.get(owner)
        if queue is not None:
            queue.put_nowait(msg)

    def _set_stalled(self, stalled: bool) -> None:
        self.stalled = stalled
        log.warning("engine loop %s", "stalled: readiness off" if stalled else "moving again")
        self._aio.create_task(self._update_health())

    async def _update_health(self) -> None:
        if self.health is not None and not self.draining:
            await self.health.set_serving(self.accepting)

    def open_gateway(self, owner: int) -> asyncio.Queue[pb.SubmitResponse | None]:
        queue: asyncio.Queue[pb.SubmitResponse | None] = asyncio.Queue()
        self._gateways[owner] = queue
        return queue

    def close_gateway(self, owner: int) -> None:
        self._gateways.pop(owner, None)
        self.compiler.abort_owned(owner)
        self.loop.submit(AbortOwned(owner))  # nobody is left to read their outputs

    def accept(self, owner: int, incoming: Incoming) -> list[Rejection]:
        """Hand a batch to the loop; return the requests that cannot be taken, refused at once
        with their whole group (groups.screen)."""
        requests, rejected = screen(incoming.requests, self._admissible)
        requests, constrained = split(requests)
        for group in constrained:  # they reach the loop once their grammar is compiled
            self.compiler.start(owner, group)
        self.compiler.abort(incoming.abort_ids)
        self.loop.submit(Submission(owner, requests, incoming.abort_ids))
        return rejected

    def _admissible(self, req: NewRequest | Invalid) -> NewRequest:
        if not self.accepting:
            raise Refused(grpc.StatusCode.UNAVAILABLE, "scheduler is not serving")
        # no step's wait: docs/reliability.md #15
        if self.loop.queue_full(held=len(self.compiler)):
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        if isinstance(req, Invalid):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, req.message)
        return req


class SchedulerServicer(pb_grpc.SchedulerServiceServicer):
    def __init__(self, app: SchedulerApp) -> None:
        self._app = app
        self._owners = itertools.count(1)

    async def Submit(
        self, request_iterator: AsyncIterator[pb.SubmitRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SubmitResponse]:
        owner = next(self._owners)
        outbox = self._app.open_gateway(owner)
        await context.send_initial_metadata(())  # lets the client's wait_for_connection return
        reader = asyncio.create_task(self._read(owner, request_iterator, outbox))
        try:
            while (msg := await outbox.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            self._app.close_gateway(owner)

    async def _read(
        self, owner: int, requests: AsyncIterator[pb.SubmitRequest], outbox: asyncio.Queue
    ) -> None:
        try:
            async for msg in requests:
                rejected = self._app.accept(owner, convert.incoming_from_pb(msg))
                if rejected:
                    outbox.put_nowait(convert.acks_to_pb(Acks(owner, [], rejected)))
        finally:
            outbox.put_nowait(None)  # the gateway half-closed or went away: end the stream

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        engine = self._app.loop.engine
        if engine is None:
            raise unavailable("the model is still loading")
        return convert.model_info_to_pb(engine.model_info)

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatsResponse:
        return convert.stats_to_pb(self._app.loop.stats)


class Served(NamedTuple):
    server: grpc.aio.Server
    port: int
    app: SchedulerApp


async def create_server(address: str, app: SchedulerApp) -> Served:
    """Build the scheduler server on `address` and start the app (loop thread + link)."""
    server = rpc.create_aio_server(
        [*auth.interceptors(app.secret), ErrorInterceptor()], rpc.INTERNAL_SERVER_OPTIONS
    )
    pb_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(app), server)
    app.health = rpc.Health(server, [SERVICE_NAME])
    rpc.enable_reflection(server, [SERVICE_NAME])
    port = rpc.bind(server, address)
    await app.health.set_serving(False)
    app.start()
    return Served(server, port, app)


async def serve(
    address: str,
    engine_config: Any,
    detokenizer_address: str,
    metrics_port: int | None = None,
    drain_timeout_s: float = 30.0,
    secret: str | None = None,
    watchdog_s: float | None = 60.0,
) -> int:
    """Entry point of `radixserve scheduler`: load the model on the loop thread while health says
    NOT_SERVING, serve, drain on SIGTERM; exit 1 if the engine loop dies or hangs (watchdog)."""
    from radixserve.engine.core import EngineCore
    from radixserve.services.common.lifecycle import run_until_signal
    from radixserve.services.scheduler import faults, synthetic
    from radixserve.services.scheduler.metrics import serve_metrics

    # The engine thread shares the interpreter with the gRPC event loop, which may run for many
    # milliseconds when a step's outputs go out to hundreds of streams. A thread that wants the
    # interpreter waits up to the switch interval (5 ms by default) for the other to let go: a
    # whole decode step. A short interval bounds what the engine thread waits.
    sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)
    config = LoopConfig(
        max_waiting_requests=engine_config.max_queued_requests,
        max_running_requests=engine_config.max_running_requests,
        watchdog_s=watchdog_s,
    )
    # Benchmark and test hooks, no-ops unless their variables are set: a model-free engine that
    # loads the services at a GPU's rate, and injected engine faults.
    factory = (synthetic.factory_from_env(engine_config.model_path,
                                          engine_config.max_running_requests)
               or faults.wrap_factory(lambda: EngineCore(engine_config)))
    app = SchedulerApp(factory, detokenizer_address, config, secret)
    app.freeze_when_ready = True  # the model loads after run_until_signal's freeze
    served = await create_server(address, app)
    if metrics_port:
        serve_metrics(metrics_port, lambda: app.loop.stats)
    await served.server.start()
    log.info("scheduler listening on %s; loading %s", address, engine_config.model_path)
    return await run_until_signal(
        served.server, lambda: app.drain(drain_timeout_s), fatal=app.fatal
    )
