"""The gateway's Process stream to the tokenizer: jobs batched from many calls, answers by id."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2_grpc
from radixserve.internal.tokenizer.v1 import tokenizer_pb2_grpc as tok_grpc
from radixserve.services.common import rpc
from radixserve.services.common.errors import ServiceError, unavailable
from radixserve.services.gateway import convert
from radixserve.services.gateway.streams import Outbox, end_session, first_exit, reconnect_forever
from radixserve.services.gateway.types import Failure, JobResult

log = logging.getLogger(__name__)


class TokenizerLink:
    """Losing it fails only the jobs in flight (prompts being tokenized): requests already at a
    scheduler do not need it."""

    def __init__(self, address: str, on_change: Callable[[TokenizerLink], None],
                 metadata: tuple[tuple[str, str], ...] = (), retry_s: float = 0.5) -> None:
        self.address = address
        self._on_change = on_change
        self._md = metadata
        self._retry_s = retry_s
        self._jobs: Outbox[Message] = Outbox()
        self._pending: dict[str, asyncio.Future[JobResult | Failure]] = {}
        self.connected = False
        self.has_chat_template = False

    @property
    def pending_jobs(self) -> int:
        return len(self._pending)

    async def run_job(self, job_id: str, job: Message) -> JobResult:
        """Run one job (batched with its neighbours); ServiceError on its failure."""
        if not self.connected:
            raise unavailable("the tokenizer is not connected")
        future: asyncio.Future[JobResult | Failure] = asyncio.get_running_loop().create_future()
        self._pending[job_id] = future
        self._jobs.put(job)
        try:
            result = await future
        finally:
            self._pending.pop(job_id, None)
        if isinstance(result, Failure):
            raise ServiceError(result.code, result.message)
        return result

    async def run(self) -> None:
        async with rpc.internal_channel(self.address) as channel:
            stub = tok_grpc.TokenizerServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            await reconnect_forever(f"tokenizer {self.address}",
                                    lambda: self._session(stub, health), self._retry_s)

    async def _session(self, stub: tok_grpc.TokenizerServiceStub,
                       health: health_pb2_grpc.HealthStub) -> None:
        call: grpc.aio.StreamStreamCall | None = None
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._wait_serving(stub, health)
            call = stub.Process(metadata=self._md)
            await call.wait_for_connection()
            tasks = [asyncio.create_task(self._pump(call)),
                     asyncio.create_task(self._read(call))]
            self._set(True)
            log.info("tokenizer %s connected", self.address)
            await first_exit(tasks)
        finally:
            end_session(tasks, call)
            self._set(False)
            self._jobs.clear()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(unavailable("the tokenizer service is unavailable"))

    async def _wait_serving(self, stub: tok_grpc.TokenizerServiceStub,
                            health: health_pb2_grpc.HealthStub) -> None:
        while True:
            try:
                await rpc.require_serving(health)
                _, request = convert.model_info_requests()
                reply = await stub.GetTokenizerInfo(request, timeout=5.0, metadata=self._md)
                self.has_chat_template = convert.has_chat_template(reply)
                return
            except (grpc.aio.AioRpcError, rpc.NotServing) as exc:
                log.debug("tokenizer %s not ready yet: %s", self.address, exc)
                await asyncio.sleep(self._retry_s)

    async def _pump(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            await call.write(convert.jobs_to_pb(await self._jobs.take_batch()))

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        async for response in call:
            for job_id, result in convert.job_results_from_pb(response):
                future = self._pending.get(job_id)
                if future is not None and not future.done():
                    future.set_result(result)

    def _set(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self._on_change(self)
