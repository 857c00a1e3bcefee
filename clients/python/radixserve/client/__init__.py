"""Python client for radixserve: sync and asyncio clients over the radixserve.v1 gRPC contract.

Depends only on grpcio and protobuf (prompt_toolkit for the grpc-shell REPL), never on the engine.
"""

from .aio import AsyncClient
from .channel import DEFAULT_TARGET
from .sync import Client
from .types import (
    ChatMessage,
    Delta,
    Event,
    Finished,
    FinishReason,
    GenerateOptions,
    GenerationResult,
    Message,
    ModelInfo,
    RadixServeError,
    ServerInfo,
    Started,
    Timings,
    TokenLogprob,
    TopLogprob,
    Usage,
)

__all__ = [
    "DEFAULT_TARGET",
    "AsyncClient",
    "ChatMessage",
    "Client",
    "Delta",
    "Event",
    "FinishReason",
    "Finished",
    "GenerateOptions",
    "GenerationResult",
    "Message",
    "ModelInfo",
    "RadixServeError",
    "ServerInfo",
    "Started",
    "Timings",
    "TokenLogprob",
    "TopLogprob",
    "Usage",
]
