"""Frozen configuration of the serving processes, built once from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.engine.config import EngineConfig
from radixserve.services.common.auth import PublicSecurity
from radixserve.services.gateway.frontend import FrontendConfig
from radixserve.services.gateway.routing import ROUTING_POLICIES, RoutingConfig

DEFAULT_GATEWAY_ADDRESS = "127.0.0.1:50051"
DEFAULT_TOKENIZER_ADDRESS = "127.0.0.1:50052"
DEFAULT_SCHEDULER_ADDRESS = "127.0.0.1:50053"
DEFAULT_DETOKENIZER_ADDRESS = "127.0.0.1:50054"

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
