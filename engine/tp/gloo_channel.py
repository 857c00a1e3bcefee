"""Step plans over a gloo process group: rank 0 broadcasts, followers receive.

The group has its own, long timeout: followers idle here between requests, and a peer that dies is
still noticed at once (its sockets close). It works across hosts, unlike shared memory.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from radixserve.engine.distributed import CollectiveGuard
from radixserve.engine.tp.channel import ControlChannel

CONTROL_TIMEOUT = datetime.timedelta(days=365)  # idle followers wait here; far below clock overflow
HEADER_BYTES = 4096  # one broadcast carries a plan this small (most steps); larger ones take two


class GlooChannel(ControlChannel):
    """Rank 0 broadcasts opaque bytes (a serialized plan) to the other ranks over a gloo group;
    heartbeats are counters in rank 0's TCP store.

    Wire: a fixed HEADER_BYTES buffer holds an 8-byte little-endian length and the first bytes of
    the message; anything longer follows in a second broadcast of exactly the remainder.
    """

    def __init__(self, rank: int, world_size: int, store: dist.Store,
                 guard: CollectiveGuard) -> None:
        # every rank creates the group together, after the default group exists
        self.group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        self.rank, self.world_size, self.store, self.guard = rank, world_size, store, guard
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

    def beat(self) -> None:
        self.store.add(f"heartbeat/{self.rank}", 1)  # the store client serializes its calls

    def beats(self) -> list[int]:
        return [0] + [self.store.add(f"heartbeat/{r}", 0) for r in range(1, self.world_size)]
