"""gRPC server and channel construction with explicit limits, health, and reflection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

MiB = 1024 * 1024

# Public edge: bounded messages and metadata so one client cannot make the server buffer without
# limit; at most 1024 streams per connection (more wait in the client); keepalive pings find dead
# clients; a client that pings more often than every 10 s gets GOAWAY after two strikes; idle
# connections are closed after 30 min.
PUBLIC_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", 4 * MiB),
    ("grpc.max_send_message_length", 16 * MiB),
    ("grpc.max_metadata_size", 16 * 1024),
    ("grpc.absolute_max_metadata_size", 32 * 1024),
    ("grpc.max_concurrent_streams", 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 2),
    ("grpc.max_connection_idle_ms", 30 * 60_000),
    ("grpc.so_reuseport", 0),
)

# Internal hops carry batches of a whole step, so the limits are larger; pings are frequent so a
# dead peer is noticed within seconds even when no data flows.
INTERNAL_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", 256 * MiB),
    ("grpc.max_send_message_length", 256 * MiB),
    ("grpc.max_metadata_size", 16 * 1024),
    ("grpc.max_concurrent_streams", 256),
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),
)

INTERNAL_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", 256 * MiB),
    ("grpc.max_send_message_length", 256 * MiB),
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a peer restarts instead of backing off for up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)


def create_aio_server(
    interceptors: Sequence[grpc.aio.ServerInterceptor], options: Iterable[tuple[str, int]]
) -> grpc.aio.Server:
    return grpc.aio.server(interceptors=list(interceptors), options=list(options))


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the public port: its certificate chain and key, and optionally the CA that
    client certificates must chain to (mutual TLS: clients without one are refused)."""

    cert: str
    key: str
    client_ca: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        client_ca = read(self.client_ca) if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(read(self.key), read(self.cert))],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )


def bind(server: grpc.aio.Server, address: str, tls: TlsFiles | None = None) -> int:
    """Bind `address` ("host:port", port 0 for any, or "unix:/path"), with TLS when `tls` is
    given; return the bound port."""
    if tls is not None:
        port = server.add_secure_port(address, tls.credentials())
    else:
        port = server.add_insecure_port(address)
    if port == 0 and not address.startswith("unix:"):
        raise OSError(f"could not bind {address}")
    return port


def internal_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=list(INTERNAL_CHANNEL_OPTIONS))


class Health:
    """grpc.health.v1 for one server: the overall status ("") plus each named service."""

    def __init__(self, server: grpc.aio.Server, service_names: Iterable[str]) -> None:
        self.servicer = health.aio.HealthServicer()
        self._names = ["", *service_names]
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        self.serving = False

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self.serving = serving
        for name in self._names:
            await self.servicer.set(name, status)

    async def shutdown(self) -> None:
        """NOT_SERVING for good: later set_serving calls are ignored by the servicer."""
        self.serving = False
        await self.servicer.enter_graceful_shutdown()


def enable_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    reflection.enable_server_reflection(
        [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )


async def check_health(address: str, service: str = "", timeout: float = 1.0) -> bool:
    """One health probe; False on any RPC failure (the peer is starting or gone)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service),
                                     timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class NotServing(Exception):
    """A backend answered its health check with something other than SERVING."""


async def watch_serving(stub: health_pb2_grpc.HealthStub) -> AsyncIterator[bool]:
    """A peer's health as it changes: True for SERVING, False for anything else."""
    async for reply in stub.Watch(health_pb2.HealthCheckRequest(service="")):
        yield reply.status == health_pb2.HealthCheckResponse.SERVING


async def require_serving(stub: health_pb2_grpc.HealthStub, timeout: float = 2.0) -> None:
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise NotServing(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
