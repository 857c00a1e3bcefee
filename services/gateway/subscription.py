"""The gateway's Subscribe stream to one detokenizer: every step's deltas, routed by request id."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from radixserve.internal.detokenizer.v1 import detokenizer_pb2_grpc as detok_grpc
from radixserve.services.common import rpc
from radixserve.services.gateway import convert
from radixserve.services.gateway.streams import Lost, reconnect_forever
from radixserve.services.gateway.types import Output, StepTimes

log = logging.getLogger(__name__)


class DetokenizerSubscription:
    """`connected` only once the detokenizer has registered this gateway: a request sent to a
    scheduler before that could lose its first outputs. On a loss, `on_change(False)` fires and
    the gateway fails the requests of the replicas that stream to this detokenizer."""

    def __init__(
        self,
        address: str,
        subscriber: str,
        on_output: Callable[[Output], None],
        on_change: Callable[[DetokenizerSubscription], None],
        on_step: Callable[[StepTimes], None],
        metadata: tuple[tuple[str, str], ...] = (),
        retry_s: float = 0.5,
    ) -> None:
        self.address = address
        self._subscriber = subscriber  # this gateway's name: the detokenizer sends only its deltas
        self._on_output = on_output
        self._on_change = on_change
        self._on_step = on_step  # once per step's message, with the step's times
        self._md = metadata
        self._retry_s = retry_s
        self.connected = False
        self._stub: detok_grpc.DetokenizerServiceStub | None = None

    async def run(self) -> None:
        async with rpc.internal_channel(self.address) as channel:
            self._stub = detok_grpc.DetokenizerServiceStub(channel)
            await reconnect_forever(f"detokenizer {self.address}", self._session, self._retry_s)

    async def live_requests(self) -> int:
        """Requests it holds state for (GetServerInfo); 0 when it is not connected."""
        if self._stub is None or not self.connected:
            return 0
        _, request = convert.stats_requests()
        try:
            reply = await self._stub.GetStats(request, timeout=5.0, metadata=self._md)
        except grpc.aio.AioRpcError as exc:
            log.debug("detokenizer %s: stats failed: %s", self.address, exc.code().name)
            return 0
        return convert.live_requests_from_pb(reply)

    async def _session(self) -> None:
        assert self._stub is not None
        call = self._stub.Subscribe(convert.subscribe_request(self._subscriber),
                                    wait_for_ready=True,
                                    metadata=self._md)
        try:
            await call.wait_for_connection()
            self._set(True)
            log.info("detokenizer %s subscribed", self.address)
            on_output, on_step = self._on_output, self._on_step
            async for response in call:
                outputs = convert.outputs_from_pb(response)
                if outputs:  # (the detokenizer sends no empty step)
                    on_step(convert.step_times_from_pb(response))
                for output in outputs:
                    on_output(output)
            raise Lost("the detokenizer closed the stream")
        finally:
            call.cancel()
            self._set(False)

    def _set(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self._on_change(self)
