"""The communicator the layers call for their two collectives, and the one they see while built.

Layers capture the communicator when they are built (`get_comm()` inside `__init__`), so the global
only has to be right while a model is constructed; `comm_scope` sets it for that span.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class TPGroupError(RuntimeError):
    """A tensor-parallel peer died, hung past the timeout, or left the group."""


class Communicator(ABC):
    """The TP group as seen by the layers. Implementations: single rank, and the ones registered by
    name in `radixserve.engine.distributed` (`create_comm`).

    Every rank must end a collective with bitwise-identical results: followers sample from their
    own logits and must pick the same tokens as rank 0, or their token pools drift apart.
    """

    rank: int
    world_size: int
    # Whether `all_reduce` / `all_gather` may run inside a CUDA graph capture: no host sync, no
    # host-side state that differs between capture and replay.
    supports_cuda_graph: bool = False

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over ranks (may work in place); returns the reduced tensor."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's `x` along `dim`, in rank order."""

    def min_over_ranks(self, value: int) -> int:
        """The smallest `value` over ranks: set-up agreement (e.g. KV pages that fit everywhere)."""
        return value

    def abort(self) -> None:
        """Make collectives in flight on this rank fail instead of waiting for a peer that is gone.
        Called from another thread (a watchdog) while the owner may be blocked in one."""

    def close(self) -> None:
        """Leave the group; the communicator is unusable after."""


class SingleRankComm(Communicator):
    rank = 0
    world_size = 1
    supports_cuda_graph = True  # nothing to communicate

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return x


_comm: Communicator = SingleRankComm()


def get_comm() -> Communicator:
    return _comm


def set_comm(comm: Communicator) -> None:
    global _comm
    _comm = comm


@contextmanager
def comm_scope(comm: Communicator) -> Iterator[Communicator]:
    """Make `comm` the one layers see while a model is built; restore the previous one after."""
    previous = get_comm()
    set_comm(comm)
    try:
        yield comm
    finally:
        set_comm(previous)
