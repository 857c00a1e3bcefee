"""A pluggable communicator for the two collectives the layers use.

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
    """The TP group as seen by the layers. Implementations: single rank, torch.distributed.

    Every rank must end a collective with bitwise-identical results: followers sample from their
    own logits and must pick the same tokens as rank 0, or their token pools drift apart.
    """

    rank: int
    world_size: int

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over ranks (may work in place); returns the reduced tensor."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's `x` along `dim`, in rank order."""

    def min_over_ranks(self, value: int) -> int:
        """The smallest `value` over ranks: set-up agreement (e.g. KV pages that fit everywhere)."""
        return value


class SingleRankComm(Communicator):
    rank = 0
    world_size = 1

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
