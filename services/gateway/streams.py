"""Building blocks of the gateway's long-lived backend streams: a batching outbox, the reconnect
loop every link runs, and how a session waits for its streams and ends them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import grpc
from radixserve.services.gateway.inbox import take_all

log = logging.getLogger(__name__)
T = TypeVar("T")


class Outbox(Generic[T]):
    """Items queued by many concurrent client RPCs, taken out by one stream writer as a batch, so
    a burst of N requests costs one write per hop, not N."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[T] = asyncio.Queue()

    def put(self, item: T) -> None:
        self._queue.put_nowait(item)

    async def take_batch(self) -> list[T]:
        return await take_all(self._queue)

    def clear(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()


class Lost(Exception):
    """A backend closed a stream that should live as long as the connection."""


async def reconnect_forever(name: str, session: Callable[[], Awaitable[None]],
                            retry_s: float) -> None:
    """Run `session` again `retry_s` after each end, until cancelled. A lost backend is logged
    as a warning; any other error as a bug, which must still not wedge the gateway."""
    while True:
        try:
            await session()
        except (grpc.aio.AioRpcError, Lost) as exc:
            reason = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning("%s: link lost: %s", name, reason)
        except Exception:
            log.exception("%s: link failed; reconnecting", name)
        await asyncio.sleep(retry_s)


def end_session(tasks: list[asyncio.Task[None]], call: grpc.aio.Call | None) -> None:
    """A session's teardown, whatever ended it: cancel its stream tasks, then its call (None
    when the session ended before opening it)."""
    for task in tasks:
        task.cancel()
    if call is not None:
        call.cancel()


async def first_exit(tasks: list[asyncio.Task[None]]) -> None:
    """Wait until one of a session's stream tasks ends; raise its error, or Lost if it just ended
    (a backend closed its side)."""
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        error = task.exception()
        if error is not None:
            raise error
    raise Lost("a backend closed its stream")
