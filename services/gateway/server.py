"""gRPC server of the gateway: the public radixserve.v1.GenerateService.

Servicer methods only parse, call the frontend, and build replies; statuses come from the
ServiceErrors the frontend raises (mapped by the ErrorInterceptor).

`auth.PublicSecurity` turns on the API key check (every RPC but health) and TLS / mutual TLS on
the public port. With TLS, `probe_address` adds a plaintext listener for the supervisor's health
probe; it must be a unix socket in a folder only the serving user can open (the supervisor puts it
next to the internal sockets), and the API key is still checked there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from importlib import metadata
from typing import NamedTuple

import grpc
from radixserve.services.common import auth, rpc
from radixserve.services.common.errors import ErrorInterceptor
from radixserve.services.gateway import convert
from radixserve.services.gateway.frontend import Frontend, FrontendConfig
from radixserve.services.gateway.links import BackendAddresses, Links
from radixserve.services.gateway.metrics import GatewayMetrics
from radixserve.services.gateway.retire import retire
from radixserve.services.gateway.routing import RoutingConfig
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
CALLS_CLOSE_S = 2.0  # after the drain, how long to wait for the last handlers to return
FLUSH_S = 0.2  # between the last handler's status and the process exit
READY_POLL_S = 0.02  # a gateway sharing its port listens only once its backends are ready
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GenerateService"].full_name


def _version() -> str:
    try:
        return metadata.version("radixserve")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class GenerateServicer(pb_grpc.GenerateServiceServicer):
    def __init__(self, frontend: Frontend, routing: str) -> None:
        self._frontend = frontend
        self._routing = routing
        self._version = _version()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Writes each event itself rather than yielding it. A client's cancel reaches this task
        wherever it waits, often on a write; `aclosing` then ends `Frontend.run` (which aborts the
        request in the scheduler) in the same task. As an async generator handler, the cancel
        would land in grpc's write loop, outside the generator, whose cleanup then waited for the
        generator to be finalized, several busy event-loop turns later."""
        spec = convert.generate_spec_from_pb(request)
        handle = self._frontend.open(spec)
        async with contextlib.aclosing(self._frontend.run(handle)) as events:
            async for event in events:
                await context.write(convert.event_to_pb(handle.public_id, event))

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        ids = await self._frontend.tokenize(convert.tokenize_prompt_from_pb(request))
        return convert.tokenize_response_to_pb(ids)

    async def Detokenize(
        self, request: pb.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DetokenizeResponse:
        text = await self._frontend.detokenize(*convert.detokenize_args_from_pb(request))
        return convert.detokenize_response_to_pb(text)

    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        aborted = self._frontend.abort(convert.abort_ids_from_pb(request))
        return convert.abort_response_to_pb(aborted)

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        return convert.model_info_to_pb(self._frontend.model_info())

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        replicas, live = await self._frontend.server_info()
        return convert.server_info_to_pb(self._version, self._routing, replicas, live)


class Gateway:
    """The frontend, its backend links and its health, with one lifecycle."""

    def __init__(
        self,
        backends: BackendAddresses,
        config: FrontendConfig,
        metrics: GatewayMetrics,
        secret: str | None = None,
        routing: RoutingConfig | None = None,
    ) -> None:
        self.metrics = metrics
        self.health: rpc.Health | None = None
        self.links = Links(backends, self._on_ready, routing, auth.call_metadata(secret))
        metrics.watch_replicas(lambda: [r.report() for r in self.links.replicas])
        self.frontend = Frontend(self.links, config, metrics)
        self.links.events = self.frontend
        self._links_task: asyncio.Task[None] | None = None
        self.open_calls: Callable[[], int] = lambda: 0  # public RPC handlers running now

    def start(self) -> None:
        self._links_task = asyncio.create_task(self.links.run())

    def _on_ready(self, ready: bool) -> None:
        log.info("gateway %s", "ready" if ready else "not ready")
        if self.health is not None and not self.frontend.draining:
            asyncio.get_running_loop().create_task(self.health.set_serving(ready))

    async def drain(self) -> None:
        """NOT_SERVING, then UNAVAILABLE for new calls; in-flight ones finish or are ended with
        UNAVAILABLE at the drain timeout; returns once no handler is left (or after a bound:
        a health Watch stream never ends by itself)."""
        if self.health is not None:
            await self.health.shutdown()
        await self.frontend.drain()
        if self._links_task is not None:
            self._links_task.cancel()
        deadline = time.monotonic() + CALLS_CLOSE_S
        while self.open_calls() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)


class Served(NamedTuple):
    server: grpc.aio.Server
    port: int
    gateway: Gateway


async def create_server(
    address: str,
    backends: BackendAddresses,
    config: FrontendConfig | None = None,
    metrics: GatewayMetrics | None = None,
    secret: str | None = None,
    security: auth.PublicSecurity | None = None,
    routing: RoutingConfig | None = None,
    reuse_port: bool = False,
    connection_age_s: float = 0.0,
) -> Served:
    """Build the gateway on `address` (port 0 picks one) and start connecting to the backends.
    `connection_age_s` > 0: each client connection gets a GOAWAY at that age (its calls in flight
    finish), so clients spread again over the gateways sharing the port and one can retire."""
    metrics = metrics or GatewayMetrics()
    security = security or auth.PublicSecurity()
    gateway = Gateway(backends, config or FrontendConfig(), metrics, secret, routing)
    # Refusals by the key check still pass the ErrorInterceptor, so they are counted.
    errors = ErrorInterceptor(metrics.on_status)
    gateway.open_calls = lambda: errors.open_calls
    interceptors = [errors, *auth.public_interceptors(security.api_key)]
    # The port is not shared unless asked: a stale gateway must not silently take half the calls.
    options = [(k, v) for k, v in rpc.PUBLIC_SERVER_OPTIONS if k != "grpc.so_reuseport"]
    options.append(("grpc.so_reuseport", int(reuse_port)))
    if connection_age_s > 0:
        options.append(("grpc.max_connection_age_ms", round(connection_age_s * 1000)))
    server = rpc.create_aio_server(interceptors, options)
    servicer = GenerateServicer(gateway.frontend, gateway.links.routing.policy)
    pb_grpc.add_GenerateServiceServicer_to_server(servicer, server)
    gateway.health = rpc.Health(server, [SERVICE_NAME])
    rpc.enable_reflection(server, [SERVICE_NAME])
    port = rpc.bind(server, address, security.tls)
    if security.probe_address is not None:
        rpc.bind(server, security.probe_address)
    await gateway.health.set_serving(False)
    gateway.start()
    return Served(server, port, gateway)


async def serve(
    address: str,
    backends: BackendAddresses,
    config: FrontendConfig,
    metrics_port: int | None = None,
    secret: str | None = None,
    security: auth.PublicSecurity | None = None,
    routing: RoutingConfig | None = None,
    reuse_port: bool = False,
    connection_age_s: float = 0.0,
) -> int:
    """Entry point of `radixserve gateway`: serve until SIGTERM, or until it has retired on
    SIGUSR2 (gateway/retire.py); drain, exit."""
    from radixserve.services.common.lifecycle import exit_now, run_until_signal

    metrics = GatewayMetrics()
    if metrics_port:
        metrics.serve_http(metrics_port)
    served = await create_server(address, backends, config, metrics, secret, security, routing,
                                 reuse_port, connection_age_s)
    if reuse_port:
        # Other gateways may serve this port already (one started again after it retired): join
        # them only once the backends are ready, or the kernel would hand this one connections
        # whose calls it can only refuse. Until then its probe does not answer either.
        while not served.gateway.links.ready:
            await asyncio.sleep(READY_POLL_S)
    await served.server.start()
    retired = _retire_on_sigusr2(served, reuse_port, connection_age_s)
    security = security or auth.PublicSecurity()
    log.info("gateway listening on %s (port %d, %s, %s)", address, served.port,
             "TLS" if security.tls else "plaintext",
             "API key required" if security.api_key else "no API key")
    code = await run_until_signal(served.server, served.gateway.drain, stop_server=False,
                                  finished=retired)
    # No `server.stop`: grpc answers the calls that race it, and those still open at its end,
    # with CANCELLED, which tells a client that it cancelled the call itself, so it does not
    # retry elsewhere. Every call has had its UNAVAILABLE from the drain; after a moment for
    # those statuses to reach the wire, exiting closes the sockets, and a call that still races
    # that sees a closed connection: UNAVAILABLE too, which clients treat as retryable.
    await asyncio.sleep(FLUSH_S)
    exit_now(code)


def _retire_on_sigusr2(served: Served, reuse_port: bool, connection_age_s: float
                       ) -> asyncio.Event:
    """An event set once the gateway has retired after SIGUSR2; only a gateway that shares its
    port and ages its connections can retire without failing calls, others log and go on."""
    retired = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def run() -> None:
        await retire(served.port, connection_age_s, lambda: served.gateway.frontend.live_requests)
        retired.set()

    def on_signal() -> None:
        if not (reuse_port and connection_age_s > 0):
            log.error("SIGUSR2 ignored: a gateway retires only when it shares its port "
                      "(--reuse-port) and ages its connections (--max-connection-age)")
        elif not tasks:
            tasks.append(asyncio.create_task(run()))

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, on_signal)
    return retired
