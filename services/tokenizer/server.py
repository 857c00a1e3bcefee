"""gRPC server of the tokenizer service (radixserve.internal.tokenizer.v1)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import grpc
from radixserve.internal.tokenizer.v1 import tokenizer_pb2 as pb
from radixserve.internal.tokenizer.v1 import tokenizer_pb2_grpc as pb_grpc
from radixserve.services.common import auth, rpc
from radixserve.services.common.errors import ErrorInterceptor
from radixserve.services.tokenizer import convert
from radixserve.services.tokenizer.core import JobFailure, TokenizerCore

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TokenizerService"].full_name


class TokenizerServicer(pb_grpc.TokenizerServiceServicer):
    """Answers each batch of jobs with one message. Jobs run on worker threads, so a slow or
    poisonous input never blocks the event loop (health checks, other batches)."""

    def __init__(self, core: TokenizerCore, workers: int) -> None:
        self._core = core
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenize")

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessRequest], context: grpc.aio.ServicerContext
    ) -> None:
        write_lock = asyncio.Lock()  # grpc allows one outstanding write per stream
        await context.send_initial_metadata(())  # lets the client's wait_for_connection return
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for request in request_iterator:
                task = asyncio.create_task(self._answer(request, context, write_lock))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _answer(
        self, request: pb.ProcessRequest, context: grpc.aio.ServicerContext, lock: asyncio.Lock
    ) -> None:
        ids, jobs = convert.jobs_from_pb(request)
        runnable = [job for job in jobs if not isinstance(job, JobFailure)]
        loop = asyncio.get_running_loop()
        done = iter(await loop.run_in_executor(self._pool, self._core.run_batch, runnable))
        outcomes = [job if isinstance(job, JobFailure) else next(done) for job in jobs]
        response = convert.results_to_pb(ids, outcomes)
        async with lock:
            await context.write(response)

    async def GetTokenizerInfo(
        self, request: pb.GetTokenizerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTokenizerInfoResponse:
        return convert.info_to_pb(self._core.info)



class Served(NamedTuple):
    server: grpc.aio.Server
    port: int
    health: rpc.Health


async def create_server(
    address: str, core: TokenizerCore, workers: int = 2, secret: str | None = None
) -> Served:
    """Build (not start) the tokenizer server on `address`; port 0 picks a free port."""
    server = rpc.create_aio_server(
        [*auth.interceptors(secret), ErrorInterceptor()], rpc.INTERNAL_SERVER_OPTIONS
    )
    servicer = TokenizerServicer(core, workers)
    pb_grpc.add_TokenizerServiceServicer_to_server(servicer, server)
    health = rpc.Health(server, [SERVICE_NAME])
    rpc.enable_reflection(server, [SERVICE_NAME])
    port = rpc.bind(server, address)
    # The tokenizer is loaded before the server is built, so it is ready as soon as it listens.
    await health.set_serving(True)
    return Served(server, port, health)


async def serve(
    address: str, model_path: str, workers: int = 2, secret: str | None = None
) -> int:
    """Entry point of `radixserve tokenizer`: load, serve, drain on SIGTERM."""
    from radixserve.services.common.lifecycle import run_until_signal

    core = TokenizerCore.from_pretrained(model_path)
    served = await create_server(address, core, workers, secret)
    await served.server.start()
    log.info("tokenizer listening on %s (vocab %d)", address, core.info.vocab_size)
    return await run_until_signal(served.server, served.health.shutdown, stop_grace_s=5.0)
