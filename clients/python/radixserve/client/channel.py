"""Connection settings shared by the sync and asyncio clients."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

DEFAULT_TARGET = "127.0.0.1:50051"
Metadata = tuple[tuple[str, str], ...]


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

    def sync_channel(self) -> grpc.Channel:
        if self.secure:
            return grpc.secure_channel(self.target, self.credentials(), list(self.options))
        return grpc.insecure_channel(self.target, list(self.options))

    def aio_channel(self) -> grpc.aio.Channel:
        if self.secure:
            return grpc.aio.secure_channel(self.target, self.credentials(), list(self.options))
        return grpc.aio.insecure_channel(self.target, list(self.options))
