"""The gateway's long-lived batch streams to the tokenizer, scheduler and detokenizer.

Each link queues items from many concurrent client RPCs and sends whatever has accumulated as one
message, so a burst of N requests costs one write per hop, not N. `Links.run` (re)connects all
three, reports readiness, and on the loss of any of them fails every request in flight: their
outputs can no longer arrive, and a client must hear UNAVAILABLE within seconds, not hang.

Messages are opaque here: what goes out was built by `convert`, what comes in is handed to
`convert` before anyone looks at it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2_grpc
from radixserve.internal.detokenizer.v1 import detokenizer_pb2_grpc as detok_grpc
from radixserve.internal.scheduler.v1 import scheduler_pb2_grpc as sched_grpc
from radixserve.internal.tokenizer.v1 import tokenizer_pb2_grpc as tok_grpc
from radixserve.services.common import rpc
from radixserve.services.common.errors import ServiceError, unavailable
from radixserve.services.gateway import convert
from radixserve.services.gateway.inbox import take_all
from radixserve.services.gateway.types import Failure, JobResult, ModelInfo, Output

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Outbox(Generic[T]):
    """Items queued by many callers, taken out by one writer as a batch."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[T] = asyncio.Queue()

    def put(self, item: T) -> None:
        self._queue.put_nowait(item)

    async def take_batch(self) -> list[T]:
        return await take_all(self._queue)

    def clear(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()


class SchedulerEvents:
    """What the frontend hears from the links (all called on the event loop)."""

    def on_accepted(self, rid: str) -> None: ...
    def on_rejected(self, rid: str, failure: Failure) -> None: ...
    def on_output(self, output: Output) -> None: ...
    def on_lost(self, message: str) -> None: ...


class Links:
    def __init__(
        self,
        tokenizer_address: str,
        scheduler_address: str,
        detokenizer_address: str,
        on_ready: Callable[[bool], Any],
        metadata: tuple[tuple[str, str], ...] = (),
        retry_s: float = 0.5,
    ) -> None:
        self._md = metadata  # the internal secret, on every call but health checks
        self._addresses = (tokenizer_address, scheduler_address, detokenizer_address)
        self.events = SchedulerEvents()  # replaced by the frontend before `run`
        self._on_ready = on_ready
        self._retry_s = retry_s
        self._jobs: _Outbox[Message] = _Outbox()
        # A list: the requests of one Generate call (its n completions, one group), kept in one
        # message, since the scheduler takes a group whole only within one (scheduler/groups.py).
        self._submits: _Outbox[list[Message] | str] = _Outbox()  # str: an abort id
        self._pending_jobs: dict[str, asyncio.Future[JobResult | Failure]] = {}
        self.model_info: ModelInfo | None = None
        self.ready = False
        self._stubs: tuple[Any, Any, Any] | None = None
        self._health: list[health_pb2_grpc.HealthStub] = []

    # -- used by the frontend -------------------------------------------------------------------
    async def run_job(self, job_id: str, job: Message) -> JobResult:
        """Run one tokenizer job (batched with its neighbours); ServiceError on its failure."""
        if not self.ready:
            raise unavailable("the tokenizer is not connected")
        future: asyncio.Future[JobResult | Failure] = asyncio.get_running_loop().create_future()
        self._pending_jobs[job_id] = future
        self._jobs.put(job)
        try:
            result = await future
        finally:
            self._pending_jobs.pop(job_id, None)
        if isinstance(result, Failure):
            raise ServiceError(result.code, result.message)
        return result

    def submit(self, requests: list[Message]) -> None:
        """Queue the requests of one Generate call; they go out together in one message."""
        self._submits.put(requests)

    def abort(self, rid: str) -> None:
        self._submits.put(rid)

    @property
    def pending_jobs(self) -> int:
        return len(self._pending_jobs)

    async def backend_stats(self) -> dict[str, int]:
        """The scheduler's and the detokenizer's counters (for GetServerInfo)."""
        sched, detok = convert.stats_requests()
        return convert.stats_from_pb(*await asyncio.gather(
            self._unary(1, "GetStats", sched), self._unary(2, "GetStats", detok)))

    async def _unary(self, which: int, method: str, request: Any) -> Any:
        if self._stubs is None or not self.ready:
            raise unavailable("backends are not connected")
        try:
            return await getattr(self._stubs[which], method)(
                request, timeout=5.0, metadata=self._md
            )
        except grpc.aio.AioRpcError as exc:
            raise unavailable(f"backend {method} failed: {exc.code().name}") from None

    # -- connection lifecycle -------------------------------------------------------------------
    async def run(self) -> None:
        """Connect, serve, and reconnect after any loss; runs until cancelled."""
        channels = [rpc.internal_channel(address) for address in self._addresses]
        self._stubs = (
            tok_grpc.TokenizerServiceStub(channels[0]),
            sched_grpc.SchedulerServiceStub(channels[1]),
            detok_grpc.DetokenizerServiceStub(channels[2]),
        )
        self._health = [health_pb2_grpc.HealthStub(channel) for channel in channels]
        try:
            while True:
                try:
                    await self._session(*self._stubs)
                except Exception:  # a bug in a pump must not wedge the gateway: log, reconnect
                    log.exception("backend link failed; reconnecting")
                await asyncio.sleep(self._retry_s)
        finally:
            for channel in channels:
                await channel.close()

    async def _session(self, tok: Any, sched: Any, detok: Any) -> None:
        calls: list[grpc.aio.Call] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            info = await self._wait_backends(tok, sched, detok)
            tok_call, sched_call = tok.Process(metadata=self._md), sched.Submit(metadata=self._md)
            detok_call = detok.Subscribe(convert.subscribe_request(), metadata=self._md)
            calls = [tok_call, sched_call, detok_call]
            for call in calls:
                await call.wait_for_connection()
            tasks = [
                asyncio.create_task(self._pump_jobs(tok_call)),
                asyncio.create_task(self._read_results(tok_call)),
                asyncio.create_task(self._pump_submits(sched_call)),
                asyncio.create_task(self._read_acks(sched_call)),
                asyncio.create_task(self._read_deltas(detok_call)),
            ]
            self.model_info = info
            self._set_ready(True)
            log.info("backends connected: %s", info.model_name)
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            raise _Lost("a backend closed its stream")
        except (grpc.aio.AioRpcError, _Lost) as exc:
            reason = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning("backend link lost: %s", reason)
        finally:
            for task in tasks:
                task.cancel()
            for call in calls:
                call.cancel()
            was_ready = self.ready
            self._set_ready(False)
            if was_ready:
                self._fail_all("a backend service is unavailable")

    async def _wait_backends(self, tok: Any, sched: Any, detok: Any) -> ModelInfo:
        """Block until all three backends answer, and the scheduler has its model loaded."""
        while True:
            try:
                await asyncio.gather(*(rpc.require_serving(stub) for stub in self._health))
                sched_request, tok_request = convert.model_info_requests()
                model = await sched.GetModelInfo(sched_request, timeout=5.0, metadata=self._md)
                tok_info = await tok.GetTokenizerInfo(tok_request, timeout=5.0, metadata=self._md)
                return convert.model_info_from_pb(model, tok_info)
            except (grpc.aio.AioRpcError, rpc.NotServing) as exc:
                log.debug("backends not ready yet: %s", exc)
                await asyncio.sleep(self._retry_s)

    def _set_ready(self, ready: bool) -> None:
        if ready != self.ready:
            self.ready = ready
            self._on_ready(ready)

    def _fail_all(self, message: str) -> None:
        self._jobs.clear()
        self._submits.clear()
        for future in self._pending_jobs.values():
            if not future.done():
                future.set_exception(unavailable(message))
        self.events.on_lost(message)

    async def _pump_jobs(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            await call.write(convert.jobs_to_pb(await self._jobs.take_batch()))

    async def _read_results(self, call: grpc.aio.StreamStreamCall) -> None:
        async for response in call:
            for job_id, result in convert.job_results_from_pb(response):
                future = self._pending_jobs.get(job_id)
                if future is not None and not future.done():
                    future.set_result(result)

    async def _pump_submits(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            batch = await self._submits.take_batch()
            await call.write(convert.submit_to_pb(
                [r for item in batch if not isinstance(item, str) for r in item],
                [item for item in batch if isinstance(item, str)],
            ))

    async def _read_acks(self, call: grpc.aio.StreamStreamCall) -> None:
        async for response in call:
            acks = convert.acks_from_pb(response)
            for rid in acks.accepted:
                self.events.on_accepted(rid)
            for rid, failure in acks.rejected:
                self.events.on_rejected(rid, failure)

    async def _read_deltas(self, call: grpc.aio.UnaryStreamCall) -> None:
        on_output = self.events.on_output
        async for response in call:
            for output in convert.outputs_from_pb(response):
                on_output(output)


class _Lost(Exception):
    pass
