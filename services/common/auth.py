"""A shared secret on internal RPCs (RELIABILITY 28): internal services answer UNAUTHENTICATED to
calls without it, so reaching their port is not enough to drive the engine.

Health checks stay open (orchestrators probe without credentials), and so does reflection.
Secrets are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

SECRET_ENV = "RADIXSERVE_INTERNAL_SECRET"
METADATA_KEY = "x-radixserve-internal-secret"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

Metadata = tuple[tuple[str, str], ...]


def call_metadata(secret: str | None) -> Metadata:
    """Metadata that every internal call carries (empty when no secret is configured)."""
    return ((METADATA_KEY, secret),) if secret else ()


class SecretInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("an empty internal secret would accept every caller")
        self._secret = secret.encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_OPEN_PREFIXES):
            return handler
        if self._authorized(handler_call_details.invocation_metadata):
            return handler
        return _denied(handler)

    def _authorized(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == METADATA_KEY:
                given = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(given, self._secret)
        return False


def _denied(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape that only answers UNAUTHENTICATED."""

    async def deny(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong internal secret")

    serde = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, **serde)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny, **serde)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **serde)
    return grpc.stream_stream_rpc_method_handler(deny, **serde)


def interceptors(secret: str | None) -> list[grpc.aio.ServerInterceptor]:
    return [SecretInterceptor(secret)] if secret else []
