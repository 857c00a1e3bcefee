"""The torch.distributed communicator: gloo on CPU, NCCL on GPU (`cuda:r` for rank r).

Its group carries the layers' collectives under `tp_timeout_s`: in the middle of a forward every
rank is busy, so a rank that does not answer in time is dead or stuck.
"""

from __future__ import annotations

import datetime
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from radixserve.engine.distributed.comm import Communicator
from radixserve.engine.distributed.guard import CollectiveGuard

if TYPE_CHECKING:
    from radixserve.engine.distributed import CommSetup


class CustomAllReduce(ABC):
    """A faster all-reduce for the tensors it supports (e.g. small ones over peer memory);
    TorchDistComm hands everything else to torch.distributed. Results must match on every rank,
    and under CUDA graphs it runs inside the capture: no host sync, buffers allocated up front."""

    @abstractmethod
    def supports(self, x: torch.Tensor) -> bool: ...

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...


def _all_gather_single(out: torch.Tensor, x: torch.Tensor, group: dist.ProcessGroup) -> None:
    # renamed in 2.13
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, x, group=group)


class TorchDistComm(Communicator):
    def __init__(self, group: dist.ProcessGroup, rank: int, world_size: int, device: torch.device,
                 guard: CollectiveGuard, custom: CustomAllReduce | None = None) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size
        self.device, self.guard, self.custom = device, guard, custom
        # NCCL enqueues on the current stream, which a capture records; gloo runs on the host.
        self.supports_cuda_graph = device.type == "cuda"

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.custom is not None and self.custom.supports(x):
            return self.custom.all_reduce(x)
        x = x.contiguous()
        self.guard.run("all-reduce", lambda: dist.all_reduce(x, group=self.group))
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        x = x.contiguous()
        out = x.new_empty((self.world_size, *x.shape))  # (tp, *x.shape), rank-major
        self.guard.run("all-gather", lambda: _all_gather_single(out.flatten(0, 1), x, self.group))
        return torch.cat(out.unbind(0), dim=dim)

    def min_over_ranks(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        self.guard.run("agreement",
                       lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group))
        return int(t.item())

    def abort(self) -> None:
        # NCCL aborts its communicators, which ends kernels stuck waiting for a dead peer; gloo's
        # abort does nothing, and its collectives fail on their own once the peer's sockets close.
        self.group.abort()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def create_torch_comm(setup: CommSetup) -> TorchDistComm:
    """Join the default process group (every rank calls this together) and wrap it."""
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process: "
                           "run one tensor-parallel engine per process")
    cuda = setup.device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", store=setup.store, rank=setup.rank,
                            world_size=setup.world_size,
                            timeout=datetime.timedelta(seconds=setup.timeout_s),
                            device_id=setup.device if cuda else None)
    assert dist.group.WORLD is not None
    return TorchDistComm(dist.group.WORLD, setup.rank, setup.world_size, setup.device, setup.guard)
