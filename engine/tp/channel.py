"""The control channel: rank 0's step plans to the followers, the followers' heartbeats back.

Chosen by name (`EngineConfig.tp_control`); every rank opens it together, after the communicator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch.distributed as dist
from radixserve.engine.distributed import CollectiveGuard

HEARTBEAT_S = 0.5  # how often a follower's heartbeat thread calls `beat`


class ControlChannel(ABC):
    """Messages go from rank 0 to every follower, in order, each delivered once to each."""

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Rank 0: publish the next message. May wait while followers are behind; raises
        TPGroupError when the group has failed (the guard's failure) instead of waiting on."""

    @abstractmethod
    def recv(self) -> bytes:
        """A follower: the next message, waiting as long as it takes (an idle server sends none)."""

    @abstractmethod
    def beat(self) -> None:
        """A follower: show that this process still runs. Thread-safe; called every HEARTBEAT_S
        from a thread of its own, whatever the main thread is blocked in."""

    @abstractmethod
    def beats(self) -> list[int]:
        """Rank 0: each rank's heartbeat count (index = rank; rank 0's stays 0). A follower whose
        count stops growing has stopped running: killed, SIGSTOPped, or frozen holding the GIL."""

    def close(self) -> None:
        """Release what the channel holds on this rank (called after the last message)."""


ChannelFactory = Callable[[int, int, dist.Store, CollectiveGuard], ControlChannel]


def _gloo() -> ChannelFactory:
    from radixserve.engine.tp.gloo_channel import GlooChannel

    return GlooChannel


def _shm() -> ChannelFactory:
    from radixserve.engine.tp.shm_ring import ShmRingChannel

    return ShmRingChannel


_CHANNELS: dict[str, Callable[[], ChannelFactory]] = {"shm": _shm, "gloo": _gloo}


def resolve_control(kind: str) -> str:
    """'auto': the shared-memory ring, since every rank runs on rank 0's host (launch.py spawns
    them there); the gloo channel is what ranks on several hosts would need."""
    return "shm" if kind == "auto" else kind


def open_channel(kind: str, rank: int, world_size: int, store: dist.Store,
                 guard: CollectiveGuard) -> ControlChannel:
    """Every rank calls this together with the same kind."""
    name = resolve_control(kind)
    if name not in _CHANNELS:
        raise ValueError(f"unknown tensor-parallel control channel {kind!r}; known: "
                         f"{sorted(_CHANNELS) + ['auto']}")
    return _CHANNELS[name]()(rank, world_size, store, guard)
