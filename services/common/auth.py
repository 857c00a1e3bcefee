"""Credentials checked by interceptors, compared in constant time (hmac.compare_digest).

- Internal services (docs/reliability.md #28) answer UNAUTHENTICATED to calls without the shared
  secret, so reaching their port is not enough to drive the engine. Health and reflection stay open.
- The public gateway (docs/reliability.md #29), when given an API key, answers UNAUTHENTICATED to
  calls without `authorization: Bearer <key>` (exact, case-sensitive). Only grpc.health.v1 stays
  open: reflection describes the API and needs the key like every other RPC.

A refused call is answered before its request is parsed, so bytes from an unauthenticated caller
never reach a protobuf parser.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from radixserve.services.common.rpc import TlsFiles

SECRET_ENV = "RADIXSERVE_INTERNAL_SECRET"
METADATA_KEY = "x-radixserve-internal-secret"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
API_KEY_ENV = "RADIXSERVE_API_KEY"
API_KEY_HEADER = "authorization"
_PUBLIC_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PublicSecurity:
    """The public gateway port's API key and TLS. With TLS, `probe_address` adds a plaintext unix
    socket listener for the supervisor's health probe (the API key is still checked there)."""

    api_key: str | None = None  # None: no key is asked for
    tls: TlsFiles | None = None  # None: plaintext
    probe_address: str | None = None  # "unix:/private/folder/gateway.sock", or None

    def __post_init__(self) -> None:
        if self.probe_address is not None and not self.probe_address.startswith("unix:"):
            raise ValueError("the probe listener must be a unix socket")


def call_metadata(secret: str | None) -> Metadata:
    """Metadata that every internal call carries (empty when no secret is configured)."""
    return ((METADATA_KEY, secret),) if secret else ()


class _HeaderInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through when metadata `header` equals `expected`; otherwise UNAUTHENTICATED."""

    def __init__(self, header: str, expected: str, open_prefixes: tuple[str, ...],
                 refusal: str) -> None:
        self._header = header
        self._expected = expected.encode()
        self._open = open_prefixes
        self._refusal = refusal

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(self._open):
            return handler
        if self._authorized(handler_call_details.invocation_metadata):
            return handler
        return _denied(handler, self._refusal)

    def _authorized(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == self._header:
                given = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(given, self._expected)
        return False


class SecretInterceptor(_HeaderInterceptor):
    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("an empty internal secret would accept every caller")
        super().__init__(METADATA_KEY, secret, _OPEN_PREFIXES, "missing or wrong internal secret")


class ApiKeyInterceptor(_HeaderInterceptor):
    def __init__(self, api_key: str) -> None:
        if not api_key or api_key != api_key.strip():
            raise ValueError("the API key must be non-empty, without surrounding whitespace")
        super().__init__(
            API_KEY_HEADER, f"Bearer {api_key}", _PUBLIC_OPEN_PREFIXES,
            "missing or wrong API key (send metadata 'authorization: Bearer <key>')",
        )


def _denied(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape that only answers UNAUTHENTICATED, reading raw bytes."""

    async def deny(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def deny_stream(request_or_iterator: Any,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await deny(request_or_iterator, context)
        yield  # never reached; makes this an async generator like the handler it replaces

    serde = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, **serde)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **serde)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **serde)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **serde)


def interceptors(secret: str | None) -> list[grpc.aio.ServerInterceptor]:
    return [SecretInterceptor(secret)] if secret else []


def public_interceptors(api_key: str | None) -> list[grpc.aio.ServerInterceptor]:
    return [ApiKeyInterceptor(api_key)] if api_key else []
