"""Generate streams cancelled by their clients while a write is pending.

grpc.aio frees a write's native memory (its op array, the serialized message's buffer) in the
coroutine that awaits the write, once the write completes; a handler cancelled in between loses it
for good (grpc/grpc#43360). That was the gateway's RSS growth under the soaks with cancels
(docs/benchmarks.md, "30-minute soak through two replicas"). The gateway's Generate must let every
write it started see its completion, however the call ends.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from radixserve.services.gateway.server import GenerateServicer
from radixserve.services.gateway.types import Delta, Started
from radixserve.v1 import generate_pb2 as pb


class _Context:
    """A servicer context whose writes complete (or fail) when the test says so. `cut_off` counts
    the writes whose coroutine was interrupted before their completion: grpc.aio would lose what
    those held."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[None]] = []
        self.cut_off = 0

    async def write(self, message: Any) -> None:
        done = asyncio.get_running_loop().create_future()
        self.pending.append(done)
        try:
            await done
        except asyncio.CancelledError:
            self.cut_off += 1
            raise


class _Frontend:
    """One request that streams tokens until it is closed."""

    def __init__(self) -> None:
        self.open_requests = 0

    def open(self, spec: Any) -> SimpleNamespace:
        self.open_requests += 1
        return SimpleNamespace(public_id="r")

    async def run(self, handle: Any) -> AsyncIterator[Any]:
        try:
            yield Started(3, [])
            while True:
                yield Delta([7], "a", [])
        finally:
            self.open_requests -= 1


async def _serve(handler: Callable[..., Any], request: Any, context: _Context) -> None:
    """Run a server-streaming method as grpc.aio does: a coroutine writes for itself; an async
    generator's messages are written by grpc in the same task
    (server.pyx.pxi, `_finish_handler_with_stream_responses`)."""
    if inspect.isasyncgenfunction(handler):
        async for message in handler(request, context):
            await context.write(message)
    else:
        await handler(request, context)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _request() -> pb.GenerateRequest:
    request = pb.GenerateRequest()
    request.token_ids.ids.extend([1, 2, 3])
    return request


@pytest.mark.parametrize("write_fails", [False, True], ids=["completes", "fails"])
def test_client_cancel_during_a_write_lets_the_write_finish(write_fails: bool) -> None:
    streams, writes_before_cancel = 50, 3

    async def main() -> None:
        loop = asyncio.get_running_loop()
        unhandled: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, ctx: unhandled.append(ctx))
        frontend = _Frontend()
        servicer = GenerateServicer(frontend, "round_robin")  # type: ignore[arg-type]
        context = _Context()
        for _ in range(streams):
            task = asyncio.create_task(_serve(servicer.Generate, _request(), context))
            for _ in range(writes_before_cancel):
                await _settle()
                context.pending[-1].set_result(None)
            await _settle()
            assert not context.pending[-1].done()  # a write is in flight
            # The client cancels: grpc cancels the handler's task, the write still pending.
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The core completes the batch later, or fails it: the call has ended.
            write = context.pending[-1]
            if not write.done():
                if write_fails:
                    write.set_exception(RuntimeError("execute_batch failed"))
                else:
                    write.set_result(None)
            await _settle()
            assert context.cut_off == 0, "the handler's cancellation cut off its pending write"
            assert frontend.open_requests == 0  # the request's bookkeeping ended with the call
        gc.collect()
        await _settle()
        assert unhandled == []  # a failed leftover write is not an unretrieved task exception
        assert len(context.pending) == streams * (writes_before_cancel + 1)

    asyncio.run(main())


def test_a_write_error_still_ends_the_handler() -> None:
    async def main() -> None:
        context = _Context()
        servicer = GenerateServicer(_Frontend(), "round_robin")  # type: ignore[arg-type]
        task = asyncio.create_task(_serve(servicer.Generate, _request(), context))
        await _settle()
        context.pending[-1].set_exception(RuntimeError("execute_batch failed"))
        with pytest.raises(RuntimeError, match="execute_batch failed"):
            await task

    asyncio.run(main())
