"""Host buffers that one step's asynchronous copies read or write, reused two steps later.

A step copies small columns to the device (its inputs and sampling options, the decode graph's
slots) and its sampled ids back. On CUDA those host buffers must be pinned for the copies to run
asynchronously, and taking one from torch's caching host allocator each step (which queries the
events of earlier blocks and records one for each freed block) cost about 45 us of the engine
thread a call in a served engine on the H200 (docs/benchmarks.md). `HostBuffers` keeps its own and
hands them out in turn, so a step's copy makes no allocator call.

Reuse rests on the engine's order of steps (`ForwardOutput` in model_runner.py): step N - 1 has
completed, and the host has read its outputs, before step N + 1 is launched. So a buffer that
one call per step takes is free again two calls later: its copy has run, and whoever read what a
device-to-host copy wrote into it has done so.

    take() in step:   N - 1    N        N + 1    N + 2
    buffer:           0        1        0        1
                      ^ completed and read before step N + 1 is launched
"""

from __future__ import annotations

import struct
from typing import Sequence

import torch

TURNS = 2  # one step in flight beside the one being launched (see above)


class HostBuffers:
    """Byte buffers on the host for one caller that takes at most one a step, pinned on CUDA."""

    def __init__(self, pin: bool, turns: int = TURNS) -> None:
        """`pin`: page-locked buffers (for copies to and from a CUDA device)."""
        self.pin = pin
        self._buffers = [torch.empty(0, dtype=torch.uint8) for _ in range(turns)]
        self._turn = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """(nbytes,) uint8, the first bytes of the next buffer in turn; its contents are what the
        last caller left."""
        return self._next(nbytes)[:nbytes]

    def _next(self, nbytes: int) -> torch.Tensor:
        """The next buffer in turn, whole: at least `nbytes`, a multiple of 8 bytes if every
        request was. A buffer too small is replaced by one twice as large or `nbytes`, whichever
        is more: the one it replaces stays alive while tensors view it (and, being from torch's
        caching host allocator, until the copies recorded on it have run)."""
        i = self._turn
        self._turn = (i + 1) % len(self._buffers)
        buf = self._buffers[i]
        if buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 2 * buf.numel()), dtype=torch.uint8, pin_memory=self.pin)
            self._buffers[i] = buf
        return buf

    def receive(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Host copies of `tensors` (any device, any dtype), in the next buffer in turn, each
        tensor at a multiple of 8 bytes; on CUDA the copies are asynchronous (read them once the
        stream has run them). Run every step, so with as few torch calls as it takes: two views
        and the copy for a 1-D tensor."""
        spans, total = [], 0
        for t in tensors:
            n = t.numel() * t.element_size()
            spans.append((total, total + n))
            total += -(-n // 8) * 8
        buf = self._next(total)
        out = []
        for t, (start, end) in zip(tensors, spans):
            host = buf[start:end].view(t.dtype)
            if t.dim() != 1:
                host = host.view(t.shape)
            out.append(host.copy_(t, non_blocking=True))
        return out

    def pack_rows(self, rows: Sequence[Sequence[int]], width: int,
                  fill: Sequence[int]) -> torch.Tensor:
        """(len(rows), width) int64 on the host, in the next buffer in turn: row r holds rows[r],
        then fill[r] up to `width` (the padding of a graph's rows)."""
        R = len(rows)
        packed = self._next(8 * width * R).view(torch.int64)[: R * width].view(R, width)
        host = packed.numpy()
        for r, (values, pad) in enumerate(zip(rows, fill, strict=True)):
            n = len(values)
            # struct packs a list in one C loop; numpy converts one element at a time (3x slower)
            struct.pack_into(f"{n}q", host[r], 0, *values)
            host[r, n:] = pad
        return packed
