"""gRPC server of the detokenizer service (radixserve.internal.detokenizer.v1)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import grpc
from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as pb
from radixserve.internal.detokenizer.v1 import detokenizer_pb2_grpc as pb_grpc
from radixserve.services.common import auth, rpc
from radixserve.services.common.errors import ErrorInterceptor
from radixserve.services.detokenizer import convert
from radixserve.services.detokenizer.state import (
    Detokenizer,
    DetokenizerFactory,
    DetokenizerState,
    Setup,
)

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DetokenizerService"].full_name


class DetokenizerServicer(pb_grpc.DetokenizerServiceServicer):
    def __init__(self, factory: DetokenizerFactory, stream_interval: int = 1) -> None:
        self._factory = factory
        self._stream_interval = stream_interval
        self._states: set[DetokenizerState] = set()
        # Each gateway's queue, and the subscriber name it gave ("" for every delta).
        self._subscribers: dict[asyncio.Queue[pb.SubscribeResponse], str] = {}
        # One worker thread: steps of a stream are applied in order, off the event loop.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="detokenize")

    @property
    def live_requests(self) -> int:
        return sum(len(state) for state in self._states)

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessRequest], context: grpc.aio.ServicerContext
    ) -> None:
        loop = asyncio.get_running_loop()
        state = DetokenizerState(self._factory, self._stream_interval)
        self._states.add(state)
        await context.send_initial_metadata(())  # lets the client's wait_for_connection return
        log.info("scheduler stream opened")
        # Steps are read and stamped as they arrive, while the worker may still be applying an
        # earlier one: the received stamp is the wire's, and a backlog shows after it.
        arrivals: asyncio.Queue[tuple[pb.ProcessRequest, int] | None] = asyncio.Queue()
        reader = asyncio.create_task(_read_stamped(request_iterator, arrivals))
        try:
            while (arrival := await arrivals.get()) is not None:
                request, received = arrival
                names = set(self._subscribers.values())
                deltas, aborts = await loop.run_in_executor(self._worker, _apply, state, request,
                                                            names, received)
                for queue, name in self._subscribers.items():
                    message = deltas.get(name)
                    if message is not None:
                        queue.put_nowait(message)
                if aborts is not None:
                    await context.write(aborts)
            await reader  # the stream's end, or its error
        finally:
            reader.cancel()
            # The scheduler went away: nobody will finish its requests, so forget them all. The
            # reset runs on the worker so it cannot interleave with a step still being applied.
            self._worker.submit(state.reset)
            self._states.discard(state)
            log.info("scheduler stream closed")

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SubscribeResponse]:
        queue: asyncio.Queue[pb.SubscribeResponse] = asyncio.Queue()
        self._subscribers[queue] = convert.subscriber_from_pb(request)
        await context.send_initial_metadata(())
        try:
            while True:
                yield await queue.get()
        finally:
            del self._subscribers[queue]

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatsResponse:
        return convert.stats_to_pb(self.live_requests, len(self._subscribers))


async def _read_stamped(requests: AsyncIterator[pb.ProcessRequest],
                        arrivals: asyncio.Queue[tuple[pb.ProcessRequest, int] | None]) -> None:
    """Each step with its arrival time (wall clock, ns); None once the stream ends or fails."""
    try:
        async for request in requests:
            arrivals.put_nowait((request, time.time_ns()))
    finally:
        arrivals.put_nowait(None)


def _apply(state: DetokenizerState, request: pb.ProcessRequest, subscribers: set[str],
           received_unix_ns: int) -> tuple[dict[str, pb.SubscribeResponse],
                                           pb.ProcessResponse | None]:
    """Runs on the worker thread: convert, detokenize, convert back. (The step's deltas for each
    subscriber name that has any, the stop-string aborts for the scheduler or None.) A named
    subscriber gets its own requests' deltas and the unnamed requests'; "" gets them all."""
    step = convert.step_from_pb(request)
    result = state.apply(step)
    detokenized = time.time_ns()
    messages: dict[str, pb.SubscribeResponse] = {}
    for name in subscribers:
        deltas = [d for d in result.deltas if d.subscriber in (name, "")] if name else result.deltas
        if deltas:
            messages[name] = convert.deltas_to_pb(deltas, step.step_unix_ns, received_unix_ns,
                                                  detokenized)
    return messages, convert.aborts_to_pb(result.abort_ids) if result.abort_ids else None


def hf_factory(tokenizer: Any) -> DetokenizerFactory:
    """A factory of the engine's incremental detokenizer over one HF tokenizer (decoding through
    its byte table, else its Rust core, where that gives the same text). The decoder is built here,
    once: a byte table reads the whole vocabulary, and every request shares it."""
    from radixserve.engine.detokenize import IncrementalDetokenizer, stream_decoder

    decoder = stream_decoder(tokenizer)

    def make(setup: Setup) -> Detokenizer:
        return IncrementalDetokenizer(
            decoder,
            list(setup.prompt_ids),
            list(setup.stop),
            setup.include_stop_str,
            setup.skip_special_tokens,
        )

    return make


class Served(NamedTuple):
    server: grpc.aio.Server
    port: int
    health: rpc.Health
    servicer: DetokenizerServicer


async def create_server(
    address: str, factory: DetokenizerFactory, secret: str | None = None,
    stream_interval: int = 1,
) -> Served:
    """Build (not start) the detokenizer server on `address`; port 0 picks a free port.
    `stream_interval`: tokens per delta of a stream after its first (state.py)."""
    server = rpc.create_aio_server(
        [*auth.interceptors(secret), ErrorInterceptor()], rpc.INTERNAL_SERVER_OPTIONS
    )
    servicer = DetokenizerServicer(factory, stream_interval)
    pb_grpc.add_DetokenizerServiceServicer_to_server(servicer, server)
    health = rpc.Health(server, [SERVICE_NAME])
    rpc.enable_reflection(server, [SERVICE_NAME])
    port = rpc.bind(server, address)
    await health.set_serving(True)
    return Served(server, port, health, servicer)


async def serve(
    address: str, model_path: str, secret: str | None = None, stream_interval: int = 1,
    stop_grace_s: float = 5.0,
) -> int:
    """Entry point of `radixserve detokenizer`: load the tokenizer, serve, drain on SIGTERM."""
    from radixserve.services.common.lifecycle import run_until_signal
    from transformers import AutoTokenizer

    factory = hf_factory(AutoTokenizer.from_pretrained(model_path))
    served = await create_server(address, factory, secret, stream_interval)
    await served.server.start()
    log.info("detokenizer listening on %s", address)
    return await run_until_signal(served.server, served.health.shutdown, stop_grace_s=stop_grace_s)


