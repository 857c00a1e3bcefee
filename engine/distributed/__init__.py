"""Tensor-parallel communication: layers call only `all_reduce / all_gather` on the communicator
they captured at construction (`get_comm()`).

Implementations for more than one rank are registered by name (`EngineConfig.tp_comm`); the
factory is imported on first use, so an implementation's dependencies matter only when asked for.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from radixserve.engine.distributed.comm import (
    Communicator,
    SingleRankComm,
    TPGroupError,
    comm_scope,
    get_comm,
    set_comm,
)
from radixserve.engine.distributed.guard import CollectiveGuard


class CommSetup(NamedTuple):
    """What every rank passes to a communicator factory; all ranks call it together."""

    rank: int
    world_size: int
    device: torch.device  # this rank's device (cuda:r on GPUs)
    store: dist.Store  # rank 0's rendezvous store
    timeout_s: float  # a collective slower than this means a peer died or hung
    guard: CollectiveGuard  # turns failures into TPGroupError naming the peer


CommFactory = Callable[[CommSetup], Communicator]
_COMMS: dict[str, Callable[[], CommFactory]] = {}


def register_comm(name: str) -> Callable[[Callable[[], CommFactory]], Callable[[], CommFactory]]:
    def wrap(loader: Callable[[], CommFactory]) -> Callable[[], CommFactory]:
        _COMMS[name] = loader
        return loader

    return wrap


@register_comm("torch")
def _torch() -> CommFactory:
    from radixserve.engine.distributed.torch_comm import create_torch_comm

    return create_torch_comm


def comm_names() -> list[str]:
    return sorted(_COMMS)


def create_comm(name: str, setup: CommSetup) -> Communicator:
    if name not in _COMMS:
        raise ValueError(f"unknown tensor-parallel communicator {name!r}; known: {comm_names()}")
    return _COMMS[name]()(setup)


__all__ = ["CollectiveGuard", "CommSetup", "Communicator", "SingleRankComm", "TPGroupError",
           "comm_names", "comm_scope", "create_comm", "get_comm", "register_comm", "set_comm"]
