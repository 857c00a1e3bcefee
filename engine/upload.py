"""One host-to-device copy for a step's small host columns.

A step's inputs and sampling options are a dozen short lists (slots, positions, temperatures,
seeds, ...). `torch.tensor(values).to(device)` per list is a dozen copies, and on CUDA each one from
pageable memory goes through a staging buffer on the host. `upload_columns` writes every list into
one pinned byte buffer, copies it once, and returns typed views of the device copy. `Upload` lets
several producers (the table's writes, the step's indices, the sampling options) fill one such
copy: in a served engine on the H200, taking the pinned buffer from torch's host allocator and
starting the copy cost about 45 us of the engine thread each, per call (docs/benchmarks.md). The
model runner's step upload takes its pinned buffer from `HostBuffers` (host_buffers.py) instead.

    host buffer (uint8):  [ int64 col 0 | pad ][ int64 col 2 ][ float32 col 1 | pad ] ...
    columns of one dtype lie together, each starting at a multiple of ALIGN bytes, so each group
    views as its dtype on the device and one split cuts it into its columns

Every step calls this once or twice (the attention plan has an upload of its own), on the engine
thread whose host work bounds a small model's step, so it is written for the interpreter: lists
are packed by `struct` (a C loop; numpy converts a list element by element, 2.5x slower for 200
ints) and a dtype's columns come from one split (a slice and a view per column were three times
its cost).
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

import numpy as np
import torch
from radixserve.engine.host_buffers import HostBuffers

# Bytes. 8 would do for the widest dtype a column takes, but Triton compiles a kernel once per
# combination of its pointer arguments being multiples of 16 bytes or not: columns read by a
# kernel (the draw reads four) that start at any multiple of 8 built new variants mid-run, each a
# stall of a second or more on a machine whose compile cache is cold.
ALIGN = 16

_NUMPY = {torch.bool: np.bool_, torch.int32: np.int32, torch.int64: np.int64,
          torch.float32: np.float32}
_STRUCT = {torch.bool: "?", torch.int32: "i", torch.int64: "q", torch.float32: "f"}


def upload_columns(columns: Sequence[tuple[Sequence[Any] | torch.Tensor | np.ndarray,
                                           torch.dtype]],
                   device: torch.device, buffers: HostBuffers | None = None) -> list[torch.Tensor]:
    """`[torch.tensor(values, dtype=dtype) on device for values, dtype in columns]`, in one copy.
    Values are a list or tuple of Python numbers, a 1-D cpu tensor or a 1-D numpy array.

    Each result is a 1-D view of one device buffer. The copy does not wait for the host: on CUDA
    the host buffer is pinned, taken from `buffers` (a caller that uploads once a step: the buffer
    is reused two steps later) or else from torch's caching host allocator, which hands it out
    again only after the copy has run. On a CPU device the views are of the host buffer itself.
    """
    if not columns:  # nothing to copy (a table flush with no queued writes): no buffer either
        return []
    groups: dict[torch.dtype, list[int]] = {}  # dtype -> indices of its columns, in order
    for i, (_, dtype) in enumerate(columns):
        groups.setdefault(dtype, []).append(i)
    offsets = [0] * len(columns)
    # per dtype: its first byte, the end of its last column, its columns, the split sizes
    # (elements) and which of the split's parts are its columns (the others are padding)
    spans: list[tuple[torch.dtype, int, int, list[int], list[int], list[int]]] = []
    total = 0
    for dtype, members in groups.items():
        start, size, sizes, picks, gap = total, dtype.itemsize, [], [], 0
        for i in members:
            n = len(columns[i][0])
            padded = -(-n * size // ALIGN) * ALIGN
            offsets[i], end = total, total + n * size
            if gap:  # the previous column's padding
                sizes.append(gap)
            picks.append(len(sizes))
            sizes.append(n)
            gap = (padded - n * size) // size
            total += padded
        spans.append((dtype, start, end, members, sizes, picks))
    if buffers is not None:
        host = buffers.take(total)
    else:
        host = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    buf = host.numpy()
    for (values, dtype), start in zip(columns, offsets):
        if isinstance(values, (list, tuple)):
            struct.pack_into(f"{len(values)}{_STRUCT[dtype]}", buf, start, *values)
        else:
            buf[start : start + len(values) * dtype.itemsize].view(_NUMPY[dtype])[:] = values
    packed = host.to(device, non_blocking=True)
    out: list[torch.Tensor] = [packed] * len(columns)
    for dtype, start, end, members, sizes, picks in spans:
        view = packed[start:end].view(dtype)
        if len(members) == 1:
            out[members[0]] = view
            continue
        parts = view.split_with_sizes(sizes)  # not Tensor.split, a Python wrapper around it
        for i, k in zip(members, picks):
            out[i] = parts[k]
    return out


class Upload:
    """Columns that several producers `add` before one `send`; each reads its views afterwards.

        up = Upload(device)
        writes = up.add([(rows, torch.int64), (cols, torch.int64)])
        step = up.add([(slots, torch.int64)])
        up.send()                      # one copy
        rows_d, cols_d = up.views(writes)
    """

    def __init__(self, device: torch.device, buffers: HostBuffers | None = None) -> None:
        """`buffers`: where the host side is staged (see `upload_columns`)."""
        self.device, self.buffers = device, buffers
        self._columns: list[tuple[Any, torch.dtype]] = []
        self._views: list[torch.Tensor] | None = None

    def add(self, columns: Sequence[tuple[Sequence[Any] | torch.Tensor | np.ndarray,
                                          torch.dtype]]) -> slice:
        """Queue `columns` (as `upload_columns` takes them); the slice names them in `views`."""
        assert self._views is None, "columns added after the upload was sent"
        start = len(self._columns)
        self._columns.extend(columns)
        return slice(start, len(self._columns))

    def send(self) -> None:
        self._views = upload_columns(self._columns, self.device, self.buffers)

    def views(self, part: slice) -> list[torch.Tensor]:
        """The device columns `add` returned `part` for, in the order they were added."""
        assert self._views is not None, "views read before the upload was sent"
        return self._views[part]
