"""The interceptor's classification of what escapes a handler, without a server: a client that
went away is no bug, whatever grpc raised in the handler when it did."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import grpc
import pytest
from radixserve.services.common.errors import ErrorInterceptor


class _Context:
    def __init__(self) -> None:
        self.aborted: list[grpc.StatusCode] = []

    def time_remaining(self) -> float:
        return 30.0

    async def abort(self, code: grpc.StatusCode, details: str = "", trailers: object = ()) -> None:
        self.aborted.append(code)
        raise grpc.aio.AbortError()


async def _handler_raising(exc: BaseException) -> tuple[list[grpc.StatusCode], _Context, bool]:
    codes: list[grpc.StatusCode] = []
    interceptor = ErrorInterceptor(lambda method, code: codes.append(code))

    async def writes(request: object, context: object) -> None:  # a handler that writes itself
        raise exc

    async def continuation(details: object) -> grpc.RpcMethodHandler:
        return grpc.unary_stream_rpc_method_handler(writes)

    details = SimpleNamespace(method="/radixserve.v1.GenerateService/Generate",
                              invocation_metadata=())
    handler = await interceptor.intercept_service(continuation, details)
    context = _Context()
    with pytest.raises(BaseException) as raised:
        await handler.unary_stream(object(), context)
    return codes, context, raised.value is exc


@pytest.mark.parametrize("exc", [asyncio.CancelledError(),
                                 grpc.aio.InternalError("Failed \"execute_batch\": (<grpc ...>)")],
                         ids=["cancelled", "failed-write"])
def test_a_client_gone_mid_call_is_counted_cancelled_not_a_bug(exc, caplog):
    """grpc fails a write that was in flight when the client cancelled (ExecuteBatchError, an
    InternalError): counted CANCELLED like the cancel itself, no INTERNAL, no traceback logged
    as a bug, and no attempt to answer the dead call."""
    with caplog.at_level(logging.ERROR):
        codes, context, same = asyncio.run(_handler_raising(exc))
    assert codes == [grpc.StatusCode.CANCELLED]
    assert context.aborted == [] and same
    assert not any("bug in" in r.getMessage() for r in caplog.records)


def test_an_unexpected_exception_is_still_a_bug(caplog):
    with caplog.at_level(logging.ERROR):
        codes, context, _ = asyncio.run(_handler_raising(ValueError("boom")))
    assert codes == [grpc.StatusCode.INTERNAL]
    assert context.aborted == [grpc.StatusCode.INTERNAL]
    assert any("bug in Generate" in r.getMessage() for r in caplog.records)
