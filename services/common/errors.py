"""Typed service errors and the one interceptor that turns them (and bugs) into statuses.

Domain code raises `ServiceError(code, message)`; servicers never build statuses by hand. Anything
else that escapes a handler is a bug: it is logged with its traceback and answered INTERNAL.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)

StatusCallback = Callable[[str, grpc.StatusCode], None]


RETRY_AFTER_KEY = "retry-after-ms"
# the hint sent with RESOURCE_EXHAUSTED: about a few decode steps of a busy server
RETRY_AFTER_MS = 250


class ServiceError(Exception):
    """A request-level failure with the gRPC status it maps to (and trailing metadata to send)."""

    def __init__(
        self, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers

    def __repr__(self) -> str:
        return f"ServiceError({self.code.name}, {self.message!r})"


def invalid_argument(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def unavailable(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAVAILABLE, message)


def overloaded(message: str) -> ServiceError:
    """RESOURCE_EXHAUSTED with a retry hint in trailing metadata: the server is full right now,
    the request itself is fine and may be sent again after the hint."""
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED, message, ((RETRY_AFTER_KEY, str(RETRY_AFTER_MS)),)
    )


_CODES_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def code_from_number(number: int) -> grpc.StatusCode:
    """The StatusCode for a number carried in an internal `Status` message (unknown: INTERNAL)."""
    return _CODES_BY_NUMBER.get(number, grpc.StatusCode.INTERNAL)


def code_number(code: grpc.StatusCode) -> int:
    return int(code.value[0])


class _Malformed:
    """Stands in for a request whose bytes did not parse (truncated, not protobuf, bad UTF-8)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A deserializer that returns _Malformed instead of raising, so the handler can answer
    INVALID_ARGUMENT (a client mistake) instead of grpc's generic UNKNOWN."""
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, ValueError) as exc:
            return _Malformed(f"{type(exc).__name__}: {exc}")

    return parse


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps ServiceError to its status, anything unexpected to INTERNAL, and reports final codes.

    Request-stream RPCs (the internal long-lived streams) keep their own error handling; the
    interceptor only checks each incoming message, so one that does not parse ends the stream
    with INVALID_ARGUMENT like a malformed unary request.
    """

    def __init__(self, on_status: StatusCallback | None = None) -> None:
        self._on_status = on_status
        self.open_calls = 0  # unary and server-streaming handlers running now (drain waits on it)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _checked_stream(handler.stream_stream),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler

    def _report(self, method: str, code: grpc.StatusCode) -> None:
        if self._on_status is not None:
            self._on_status(method, code)

    def _wrap_unary(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Callable:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            self.open_calls += 1
            try:
                _reject_malformed(request)
                response = await behavior(request, context)
            except BaseException as exc:  # classified by _fail: answered or re-raised
                await self._fail(method, exc, context)
                raise
            finally:
                self.open_calls -= 1
            self._report(method, grpc.StatusCode.OK)
            return response

        return wrapped

    def _wrap_stream(self, method: str, behavior: Callable[..., Any]) -> Callable:
        """Keeps the handler's style (an async generator, or a coroutine that writes with
        `context.write`, like grpc's own health Watch): grpc forbids mixing the two."""
        if not inspect.isasyncgenfunction(behavior):
            return self._wrap_unary(method, behavior)  # same guard: one awaited call

        async def streaming(request: Any, context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[Any]:
            self.open_calls += 1
            try:
                _reject_malformed(request)
                async for response in behavior(request, context):
                    yield response
            except BaseException as exc:  # classified by _fail: answered or re-raised
                await self._fail(method, exc, context)
                raise
            finally:
                self.open_calls -= 1
            self._report(method, grpc.StatusCode.OK)

        return streaming

    async def _fail(self, method: str, exc: BaseException,
                    context: grpc.aio.ServicerContext) -> None:
        """Answer `exc` with its status (context.abort raises AbortError, which ends the RPC)."""
        if isinstance(exc, (asyncio.CancelledError, grpc.aio.InternalError)):
            # The client went away or its deadline passed; grpc already knows the final status.
            # InternalError: grpc failed a batch of the call (its ExecuteBatchError), as it does a
            # write in flight or queued when the client cancels: no bug of ours, and nothing can
            # answer the call any more. (grpc logs one that fails while the client is still there.)
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= 0
            self._report(
                method, grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
            )
            return
        if isinstance(exc, grpc.aio.AbortError):
            self._report(method, context.code() or grpc.StatusCode.UNKNOWN)
            return
        if isinstance(exc, ServiceError):
            self._report(method, exc.code)
            await context.abort(exc.code, exc.message, exc.trailers)
        if isinstance(exc, Exception):
            log.exception("bug in %s", method)
            self._report(method, grpc.StatusCode.INTERNAL)
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"internal error in {method}: {type(exc).__name__}")


def _checked_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """Hand the handler only messages that parsed; the first that did not ends the call.

    Handlers come in both of grpc's styles (an async generator, or a coroutine that writes with
    `context.write`); the wrapper keeps the style, since grpc forbids mixing the two.
    """

    def parsed(requests: AsyncIterator[Any],
               context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Malformed):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"a stream message could not be parsed ({request.reason})")
                yield request

        return gen()

    if inspect.isasyncgenfunction(behavior):
        async def streaming(requests: AsyncIterator[Any],
                            context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for response in behavior(parsed(requests, context), context):
                yield response

        return streaming

    async def writing(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behavior(parsed(requests, context), context)

    return writing


def _reject_malformed(request: Any) -> None:
    if isinstance(request, _Malformed):
        raise invalid_argument(f"the request could not be parsed ({request.reason})")
