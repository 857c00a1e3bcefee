"""asyncio client for radixserve.v1.GenerateService (grpc.aio)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from radixserve.v1 import generate_pb2 as pb

from . import wire
from .channel import DEFAULT_TARGET, ChannelConfig, Connections
from .types import Event, GenerationResult, Message, ModelInfo, RadixServeError, ServerInfo

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

    from .types import GenerateOptions

R = TypeVar("R")


class AsyncClient:
    """asyncio client; create it inside a running event loop (grpc.aio binds to it).

    >>> async with AsyncClient("127.0.0.1:50051") as c:
    ...     async with aclosing(c.generate("Hello")) as stream:
    ...         async for ev in stream: ...
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        api_key: str | None = None,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        options: Sequence[tuple[str, Any]] = (),
        connections: int = 1,
    ) -> None:
        """connections: open this many TCP connections (`serve --gateways K` gives each to one of
        its gateways); Generate calls take them in turn, abort() asks each, and the other calls
        go over the first."""
        self.config = ChannelConfig(
            target, api_key, tls, root_certificates, private_key, certificate_chain, options,
            connections,
        )
        self._conns = Connections(self.config.aio_channels())
        self._metadata = self.config.metadata()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._conns.channels))

    def generate(
        self,
        prompt: str | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        messages: Sequence[Message] | None = None,
        timeout: float | None = None,
        **options: Unpack[GenerateOptions],
    ) -> AsyncGenerator[Event, None]:
        """Async-iterate Started, Delta..., Finished. Arguments are checked here.

        Cancelling the consuming task, or aclose() on the generator, cancels the RPC. A bare
        `break` only does so when the generator is collected: wrap it in contextlib.aclosing.
        """
        request = wire.generate_request(prompt, token_ids, messages, options)
        return self._stream(request, timeout)

    async def _stream(
        self, request: pb.GenerateRequest, timeout: float | None
    ) -> AsyncGenerator[Event, None]:
        call = self._conns.next().Generate(request, timeout=timeout, metadata=self._metadata)
        try:
            async for response in call:
                ev = wire.event(response)
                if ev is not None:
                    yield ev
        except grpc.RpcError as err:
            raise RadixServeError.from_rpc_error(err) from err
        finally:
            call.cancel()  # a no-op once the stream has ended on its own

    async def generate_text(
        self,
        prompt: str | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        messages: Sequence[Message] | None = None,
        timeout: float | None = None,
        **options: Unpack[GenerateOptions],
    ) -> GenerationResult:
        builder = wire.ResultBuilder(options.get("n"))
        stream = self.generate(
            prompt, token_ids=token_ids, messages=messages, timeout=timeout, **options
        )
        async with aclosing(stream):
            async for ev in stream:
                builder.add(ev)
        return builder.result()

    async def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Message] | None = None,
        add_special_tokens: bool | None = None,
        add_generation_prompt: bool | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        req = wire.tokenize_request(text, messages, add_special_tokens, add_generation_prompt)
        return list((await self._unary(self._conns.first.Tokenize, req, timeout)).token_ids)

    async def detokenize(
        self,
        token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = False,
        timeout: float | None = None,
    ) -> str:
        req = pb.DetokenizeRequest(token_ids=token_ids, skip_special_tokens=skip_special_tokens)
        return str((await self._unary(self._conns.first.Detokenize, req, timeout)).text)

    async def abort(self, request_ids: str | Sequence[str], *, timeout: float | None = None) -> int:
        """Abort requests by id; returns how many were still running or queued. With several
        connections every one is asked: only the gateway that took a call knows its request."""
        req = pb.AbortRequest(request_ids=[request_ids] if isinstance(request_ids, str)
                              else list(request_ids))
        replies = await asyncio.gather(*(self._unary(stub.Abort, req, timeout)
                                         for stub in self._conns.stubs))
        return sum(int(r.aborted) for r in replies)

    async def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        resp = await self._unary(self._conns.first.GetModelInfo, pb.GetModelInfoRequest(), timeout)
        return wire.model_info(resp)

    async def server_info(self, *, timeout: float | None = None) -> ServerInfo:
        resp = await self._unary(self._conns.first.GetServerInfo, pb.GetServerInfoRequest(),
                                 timeout)
        return wire.server_info(resp)

    async def _unary(
        self, method: Callable[..., Awaitable[R]], request: Any, timeout: float | None
    ) -> R:
        try:
            return await method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise RadixServeError.from_rpc_error(err) from err
