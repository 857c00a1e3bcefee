"""Frozen configuration of the serving processes, built once from the command line."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from radixserve.engine.config import EngineConfig
from radixserve.services.common.auth import PublicSecurity
from radixserve.services.gateway.frontend import FrontendConfig
from radixserve.services.gateway.routing import ROUTING_POLICIES, RoutingConfig

DEFAULT_GATEWAY_ADDRESS = "127.0.0.1:50051"
DEFAULT_TOKENIZER_ADDRESS = "127.0.0.1:50052"
DEFAULT_SCHEDULER_ADDRESS = "127.0.0.1:50053"
DEFAULT_DETOKENIZER_ADDRESS = "127.0.0.1:50054"
# The gateways' connection age under `serve --gateway-recycle-s` when none is given: a retiring
# gateway serves its connections this long (and a tenth more) before it drains.
RECYCLE_CONNECTION_AGE_S = 30.0

__all__ = ["ROUTING_POLICIES", "ServeConfig"]  # the policies, for `--routing` choices


@dataclass(frozen=True)
class ServeConfig:
    """`radixserve serve`: everything the supervisor needs to start the four services."""

    engine: EngineConfig  # model_path already resolved ("demo" becomes a folder)
    gateway: FrontendConfig
    host: str = "127.0.0.1"
    port: int = 50051
    # Gateway i's on metrics_port + i; scheduler replica i's on metrics_port + gateways + i.
    metrics_port: int | None = None
    startup_timeout_s: float = 600.0
    log_level: str = "INFO"
    public: PublicSecurity = field(default_factory=PublicSecurity)  # the gateway port's key, TLS
    watchdog_timeout_s: float = 60.0  # scheduler hang watchdog; 0 turns it off
    dp_size: int = 1  # scheduler replicas (data parallelism), each with its own detokenizer
    gateways: int = 1  # gateway processes sharing the public port
    routing: RoutingConfig = field(default_factory=RoutingConfig)  # how the gateway picks one
    # Written (the public address) once every child is ready, removed at exit: what scripts and
    # exec probes wait on. A health check reaches one gateway only when several share the port.
    ready_file: str | None = None
    stream_interval: int = 1  # tokens per message of a stream after its first (the detokenizers)
    # Each gateway is replaced by a fresh process about this often, one at a time (0: never;
    # services/gateway/retire.py); a retiring gateway waits for its connections to age out.
    gateway_recycle_s: float = 0.0
    max_connection_age_s: float = 0.0  # the gateways' GOAWAY age of a client connection (0: never)

    def __post_init__(self) -> None:
        # The supervisor checks the gateway's health on this port, so it must be a real one.
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in (0, 65536), got {self.port}")
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.gateways < 1:
            raise ValueError(f"gateways must be >= 1, got {self.gateways}")
        if self.stream_interval < 1:
            raise ValueError(f"stream interval must be >= 1, got {self.stream_interval}")
        if not all(0 <= s < math.inf for s in (self.max_connection_age_s, self.gateway_recycle_s)):
            raise ValueError("max connection age and gateway recycle period must be >= 0 "
                             "seconds")
        if self.gateway_recycle_s > 0 and self.gateways < 2:
            raise ValueError("recycling gateways needs 2 or more (--gateways): the others hold "
                             "the public port while one is replaced")
        if self.gateway_recycle_s > 0 and self.max_connection_age_s <= 0:
            raise ValueError("recycling gateways needs a max connection age > 0: a retiring "
                             "gateway waits for its clients' connections to age out")
        # The gateways and then the schedulers take consecutive ports from metrics_port.
        top = 65536 - self.gateways - self.dp_size + 1
        if self.metrics_port is not None and not 0 < self.metrics_port < top:
            raise ValueError(f"metrics port must be in (0, {top}) with {self.gateways} gateway(s) "
                             f"and dp_size {self.dp_size}, got {self.metrics_port}")
        if self.dp_size > 1 and ":" in self.engine.device:
            raise ValueError(f"device {self.engine.device!r} pins one GPU; with dp_size > 1 use "
                             "'cuda' or 'auto': each replica gets GPUs of its own")
        if self.startup_timeout_s <= 0:
            raise ValueError("startup timeout must be positive")
        if self.watchdog_timeout_s < 0:
            raise ValueError("watchdog timeout must be >= 0")

    @property
    def gateway_address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"
