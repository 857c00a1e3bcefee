"""The scheduler's long-lived stream to the detokenizer, reconnected whenever it breaks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from google.protobuf.message import Message
from radixserve.internal.detokenizer.v1 import detokenizer_pb2_grpc as pb_grpc
from radixserve.services.common import rpc
from radixserve.services.scheduler import convert

log = logging.getLogger(__name__)


class DetokenizerLink:
    """Sends one message per scheduler step; hands stop-string aborts back to the scheduler.

    While the stream is down, steps are dropped: their requests cannot reach any client, and the
    owner of this link aborts all of them when `on_change(False)` fires.
    """

    def __init__(
        self,
        address: str,
        on_aborts: Callable[[list[str]], None],
        on_change: Callable[[bool], None],
        metadata: tuple[tuple[str, str], ...] = (),
        retry_s: float = 0.5,
    ) -> None:
        self._address = address
        self._metadata = metadata
        self._on_aborts = on_aborts
        self._on_change = on_change
        self._retry_s = retry_s
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()  # built by convert.step_to_pb
        self.connected = False

    def send(self, msg: Message) -> None:
        if self.connected:
            self._outbox.put_nowait(msg)

    async def run(self) -> None:
        """Connect, pump, reconnect; runs until cancelled."""
        async with rpc.internal_channel(self._address) as channel:
            stub = pb_grpc.DetokenizerServiceStub(channel)
            while True:
                await self._session(stub)
                await asyncio.sleep(self._retry_s)

    async def _session(self, stub: pb_grpc.DetokenizerServiceStub) -> None:
        call = stub.Process(wait_for_ready=True, metadata=self._metadata)
        writer: asyncio.Task[None] | None = None
        try:
            await call.wait_for_connection()
            self._set_connected(True)
            writer = asyncio.create_task(self._write(call))
            async for response in call:
                abort_ids = convert.stop_aborts_from_pb(response)
                if abort_ids:
                    self._on_aborts(abort_ids)
            log.warning("detokenizer closed the stream")
        except grpc.aio.AioRpcError as exc:
            log.warning("detokenizer stream lost: %s %s", exc.code().name, exc.details())
        finally:
            if writer is not None:
                writer.cancel()
            call.cancel()
            self._set_connected(False)

    async def _write(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            await call.write(await self._outbox.get())

    def _set_connected(self, connected: bool) -> None:
        if connected == self.connected:
            return
        self.connected = connected
        if not connected:
            while not self._outbox.empty():
                self._outbox.get_nowait()
        self._on_change(connected)
