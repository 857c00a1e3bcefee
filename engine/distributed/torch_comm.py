"""torch.distributed communicators: gloo on CPU, NCCL on GPU, plus the CPU control channel.

Two process groups per TP engine. `tp` carries the layers' collectives under a short timeout: in
the middle of a forward every rank is busy, so a rank that does not answer in time is dead or
stuck. `control` is always gloo and carries rank 0's step plans; followers idle there between
requests, so its timeout is long, and a peer that dies is still noticed at once (its sockets close).
"""

from __future__ import annotations

import datetime
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import torch
import torch.distributed as dist
from radixserve.engine.distributed.comm import Communicator, TPGroupError

T = TypeVar("T")
CONTROL_TIMEOUT = datetime.timedelta(days=365)  # idle followers wait here; far below clock overflow
HEADER_BYTES = 4096  # one broadcast carries a plan this small (most steps); larger ones take two


class ProcessGroups(NamedTuple):
    tp: dist.ProcessGroup
    control: dist.ProcessGroup


def init_process_groups(rank: int, world_size: int, store: dist.Store, device: torch.device,
                        timeout_s: float) -> ProcessGroups:
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process: "
                           "run one tensor-parallel engine per process")
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if cuda else None)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    assert dist.group.WORLD is not None
    return ProcessGroups(dist.group.WORLD, control)


class CollectiveGuard:
    """Runs collectives for one rank. The first failure becomes a TPGroupError that says which
    peer went away (`describe`); after it every call fails at once, since the group is unusable."""

    def __init__(self, rank: int, describe: Callable[[], str]) -> None:
        self.rank, self.describe = rank, describe
        self.failure: str | None = None

    def run(self, what: str, fn: Callable[[], T]) -> T:
        if self.failure is not None:
            raise TPGroupError(self.failure)
        try:
            return fn()
        except RuntimeError as e:  # DistBackendError, gloo I/O errors and timeouts all land here
            cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.failure = (f"tensor-parallel {what} failed on rank {self.rank}: {self.describe()} "
                            f"({cause})")
            raise TPGroupError(self.failure) from e


class CustomAllReduce(ABC):
    """A faster all-reduce for the tensors it supports (e.g. small ones over peer memory);
    TorchDistComm hands everything else to torch.distributed. Results must match on every rank."""

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


class ControlChannel:
    """Rank 0 broadcasts opaque bytes (a serialized plan) to the other ranks over the gloo group.

    Wire: a fixed HEADER_BYTES buffer holds an 8-byte little-endian length and the first bytes of
    the message; anything longer follows in a second broadcast of exactly the remainder.
    """

    def __init__(self, group: dist.ProcessGroup, guard: CollectiveGuard) -> None:
        self.group, self.guard = group, guard
        self._header = torch.zeros(HEADER_BYTES, dtype=torch.uint8)

    def send(self, data: bytes) -> None:
        n, room = len(data), HEADER_BYTES - 8
        header = bytearray(HEADER_BYTES)
        header[:8] = n.to_bytes(8, "little")
        header[8 : 8 + min(n, room)] = data[:room]
        self._header.copy_(torch.frombuffer(header, dtype=torch.uint8))
        self.guard.run("plan broadcast", lambda: dist.broadcast(self._header, 0, group=self.group))
        if n > room:
            rest = torch.frombuffer(bytearray(data[room:]), dtype=torch.uint8)
            self.guard.run("plan broadcast", lambda: dist.broadcast(rest, 0, group=self.group))

    def recv(self) -> bytes:
        self.guard.run("plan broadcast", lambda: dist.broadcast(self._header, 0, group=self.group))
        head = self._header.numpy().tobytes()
        n, room = int.from_bytes(head[:8], "little"), HEADER_BYTES - 8
        if n <= room:
            return head[8 : 8 + n]
        rest = torch.empty(n - room, dtype=torch.uint8)
        self.guard.run("plan broadcast", lambda: dist.broadcast(rest, 0, group=self.group))
        return head[8:] + rest.numpy().tobytes()
