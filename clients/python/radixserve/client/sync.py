"""Blocking client for radixserve.v1.GenerateService."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from contextlib import closing
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


class Client:
    """Sync client. Use as a context manager (or call close()) to release the channel.

    >>> with Client("127.0.0.1:50051") as c:
    ...     for ev in c.generate("Hello", max_new_tokens=16):
    ...         if isinstance(ev, Delta): print(ev.text, end="")
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
        self._conns = Connections(self.config.sync_channels())
        self._metadata = self.config.metadata()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._conns.channels:
            channel.close()

    def generate(
        self,
        prompt: str | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        messages: Sequence[Message] | None = None,
        timeout: float | None = None,
        **options: Unpack[GenerateOptions],
    ) -> Generator[Event, None, None]:
        """Stream Started, Delta..., Finished for one of prompt / token_ids / messages.

        Arguments are checked here, before iteration; the RPC starts on the first next().
        Leaving the loop early (break, close(), an exception such as KeyboardInterrupt) cancels
        the RPC, so the server aborts the request and frees its KV cache.
        """
        request = wire.generate_request(prompt, token_ids, messages, options)
        return self._stream(request, timeout)

    def _stream(
        self, request: pb.GenerateRequest, timeout: float | None
    ) -> Generator[Event, None, None]:
        call = self._conns.next().Generate(request, timeout=timeout, metadata=self._metadata)
        try:
            for response in call:
                ev = wire.event(response)
                if ev is not None:
                    yield ev
        except grpc.RpcError as err:
            raise RadixServeError.from_rpc_error(err) from err
        finally:
            call.cancel()  # a no-op once the stream has ended on its own

    def generate_text(
        self,
        prompt: str | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        messages: Sequence[Message] | None = None,
        timeout: float | None = None,
        **options: Unpack[GenerateOptions],
    ) -> GenerationResult:
        """Run one generation to the end and return its text, tokens, finish reason and usage."""
        builder = wire.ResultBuilder(options.get("n"))
        stream = self.generate(
            prompt, token_ids=token_ids, messages=messages, timeout=timeout, **options
        )
        with closing(stream):
            for ev in stream:
                builder.add(ev)
        return builder.result()

    def tokenize(
        self,
        text: str | None = None,
        *,
        messages: Sequence[Message] | None = None,
        add_special_tokens: bool | None = None,
        add_generation_prompt: bool | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        req = wire.tokenize_request(text, messages, add_special_tokens, add_generation_prompt)
        return list(self._unary(self._conns.first.Tokenize, req, timeout).token_ids)

    def detokenize(
        self,
        token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = False,
        timeout: float | None = None,
    ) -> str:
        req = pb.DetokenizeRequest(token_ids=token_ids, skip_special_tokens=skip_special_tokens)
        return str(self._unary(self._conns.first.Detokenize, req, timeout).text)

    def abort(self, request_ids: str | Sequence[str], *, timeout: float | None = None) -> int:
        """Abort requests by id; returns how many were still running or queued. With several
        connections every one is asked: only the gateway that took a call knows its request."""
        req = pb.AbortRequest(request_ids=[request_ids] if isinstance(request_ids, str)
                              else list(request_ids))
        return sum(int(self._unary(stub.Abort, req, timeout).aborted) for stub in self._conns.stubs)

    def model_info(self, *, timeout: float | None = None) -> ModelInfo:
        return wire.model_info(
            self._unary(self._conns.first.GetModelInfo, pb.GetModelInfoRequest(), timeout)
        )

    def server_info(self, *, timeout: float | None = None) -> ServerInfo:
        resp = self._unary(self._conns.first.GetServerInfo, pb.GetServerInfoRequest(), timeout)
        return wire.server_info(resp)

    def _unary(self, method: Callable[..., R], request: Any, timeout: float | None) -> R:
        try:
            return method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise RadixServeError.from_rpc_error(err) from err
