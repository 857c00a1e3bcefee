"""A pluggable communicator for the two collectives the layers use."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Communicator(ABC):
    """The TP group as seen by the layers. Implementations: single rank, torch.distributed."""

    rank: int
    world_size: int

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over ranks (may work in place); returns the reduced tensor."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's `x` along `dim`, in rank order."""


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
