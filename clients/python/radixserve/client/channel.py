"""Connection settings shared by the sync and asyncio clients, and the connections they open."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from radixserve.v1 import generate_pb2_grpc as pb_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
Metadata = tuple[tuple[str, str], ...]
C = TypeVar("C", grpc.Channel, grpc.aio.Channel)


@dataclass(frozen=True)
class ChannelConfig:
    """Where and how to connect. TLS is on when `tls` is set or any certificate is given."""

    target: str = DEFAULT_TARGET
    api_key: str | None = None
    tls: bool = False
    root_certificates: bytes | None = None  # PEM; None uses the system roots
    private_key: bytes | None = None  # PEM, for mutual TLS
    certificate_chain: bytes | None = None  # PEM, for mutual TLS
    options: Sequence[tuple[str, Any]] = ()  # raw grpc channel options
    # TCP connections to open. A server started with `serve --gateways K` runs K gateway
    # processes on one port and the kernel gives each connection to one of them, so a client
    # reaches several gateways only through several connections.
    connections: int = 1

    def __post_init__(self) -> None:
        if self.connections < 1:
            raise ValueError(f"connections must be at least 1, got {self.connections}")

    @property
    def secure(self) -> bool:
        return self.tls or any((self.root_certificates, self.private_key, self.certificate_chain))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            self.root_certificates, self.private_key, self.certificate_chain
        )

    def metadata(self) -> Metadata:
        # Sent as plain metadata rather than call credentials, which grpc refuses on insecure
        # channels; a gateway on loopback without TLS may still check a key.
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def _channel_options(self) -> list[tuple[str, Any]]:
        if self.connections == 1:
            return list(self.options)
        # Channels to one target share their connection unless each keeps its own pool.
        return [*self.options, ("grpc.use_local_subchannel_pool", 1)]

    def sync_channels(self) -> list[grpc.Channel]:
        """`connections` channels, each its own connection."""
        options = self._channel_options()
        if self.secure:
            return [grpc.secure_channel(self.target, self.credentials(), options)
                    for _ in range(self.connections)]
        return [grpc.insecure_channel(self.target, options) for _ in range(self.connections)]

    def aio_channels(self) -> list[grpc.aio.Channel]:
        """`connections` channels, each its own connection (inside a running event loop)."""
        options = self._channel_options()
        if self.secure:
            return [grpc.aio.secure_channel(self.target, self.credentials(), options)
                    for _ in range(self.connections)]
        return [grpc.aio.insecure_channel(self.target, options) for _ in range(self.connections)]


class Connections(Generic[C]):
    """A client's connections (`ChannelConfig.sync_channels` or `aio_channels`) and a stub on each:
    Generate calls take them in turn (`next`), calls that any gateway answers use the first, and
    abort asks every one (`stubs`), since only the gateway that took a request knows it."""

    def __init__(self, channels: list[C]) -> None:
        self.channels = channels
        self.stubs = [pb_grpc.GenerateServiceStub(channel) for channel in channels]
        self.first = self.stubs[0]
        self._turns = itertools.cycle(self.stubs)

    def next(self) -> pb_grpc.GenerateServiceStub:
        return next(self._turns)
