"""One host-to-device copy for a step's small host columns.

A step's inputs and sampling options are a dozen short lists (slots, positions, temperatures,
seeds, ...). `torch.tensor(values).to(device)` per list is a dozen copies, and on CUDA each one from
pageable memory goes through a staging buffer on the host. `upload_columns` writes every list into
one pinned byte buffer, copies it once, and returns typed views of the device copy:

    host buffer (uint8):  [ col 0 | pad ][ col 1 | pad ][ col 2 ] ...
    each column starts at a multiple of ALIGN bytes, so it views as its own dtype on the device
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

# Bytes. 8 would do for the widest dtype a column takes, but Triton compiles a kernel once per
# combination of its pointer arguments being multiples of 16 bytes or not: columns read by a
# kernel (the draw reads four) that start at any multiple of 8 built new variants mid-run, each a
# stall of a second or more on a machine whose compile cache is cold.
ALIGN = 16

_NUMPY = {torch.bool: np.bool_, torch.int32: np.int32, torch.int64: np.int64,
          torch.float32: np.float32}


def upload_columns(columns: Sequence[tuple[Sequence[Any] | torch.Tensor | np.ndarray,
                                           torch.dtype]],
                   device: torch.device) -> list[torch.Tensor]:
    """`[torch.tensor(values, dtype=dtype) on device for values, dtype in columns]`, in one copy.
    Values are a list or tuple of Python numbers, a 1-D cpu tensor or a 1-D numpy array.

    Each result is a 1-D view of one device buffer. The copy does not wait for the host: on CUDA
    the buffer is pinned, from torch's caching host allocator, which hands it out again only after
    the copy has run. On a CPU device the views are of the host buffer itself (a new one per call).
    """
    offsets: list[int] = []
    total = 0
    for values, dtype in columns:
        offsets.append(total)
        total += -(-len(values) * dtype.itemsize // ALIGN) * ALIGN
    host = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    buf = host.numpy()
    for (values, dtype), start in zip(columns, offsets):
        buf[start : start + len(values) * dtype.itemsize].view(_NUMPY[dtype])[:] = values
    packed = host.to(device, non_blocking=True)
    return [packed[start : start + len(values) * dtype.itemsize].view(dtype)
            for (values, dtype), start in zip(columns, offsets)]
