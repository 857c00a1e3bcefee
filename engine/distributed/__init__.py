"""Tensor-parallel communication: layers call only `get_comm().all_reduce / all_gather`."""

from radixserve.engine.distributed.comm import Communicator, SingleRankComm, get_comm, set_comm

__all__ = ["Communicator", "SingleRankComm", "get_comm", "set_comm"]
