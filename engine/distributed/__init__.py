"""Tensor-parallel communication: layers call only `all_reduce / all_gather` on the communicator
they captured at construction (`get_comm()`)."""

from radixserve.engine.distributed.comm import (
    Communicator,
    SingleRankComm,
    TPGroupError,
    comm_scope,
    get_comm,
    set_comm,
)

__all__ = ["Communicator", "SingleRankComm", "TPGroupError", "comm_scope", "get_comm", "set_comm"]
