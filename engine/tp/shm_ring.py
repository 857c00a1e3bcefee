"""Step plans through a shared-memory ring between the ranks of one host.

Sending a plan is a copy into the segment and one store; a follower waiting for it reads one word
in a loop, so neither side makes a system call on the way (a follower that has waited longer than
SPIN_S naps between reads, which costs it at most a nap's latency).

The segment, in aligned little-endian u64 words (an aligned store is one instruction, never torn):

    line 0            magic, number of slots, slot bytes, world size      (written once by rank 0)
    line 1 + r        rank r's heartbeat count, chunks rank r consumed    (64-byte lines: no two
                                                                            ranks write one line)
    slot k            ready, message length, chunk length, crc, payload   (at HEADER + k * slot)

A message of n bytes is cut into chunks of up to `slot bytes - 32`, which take consecutive
sequence numbers; chunk s lives in slot s % num_slots. Rank 0 writes chunk s once every follower
has consumed chunk s - num_slots (else the ring is full and it waits), then sets `ready = s + 1`.
A follower waits for `ready == s + 1`, copies the chunk out and counts it consumed.

Python has no memory fence, so a reader cannot rely on seeing the payload once it sees `ready` on
a weakly ordered CPU. Each chunk therefore carries a CRC-32 of its sequence number, lengths and
payload, and a reader that finds a mismatch reads the chunk again: a torn or stale view is retried,
never used (x86 keeps stores in order, so there it never happens).
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable
from multiprocessing import resource_tracker, shared_memory

import torch.distributed as dist
from radixserve.engine.distributed import CollectiveGuard, TPGroupError
from radixserve.engine.tp.channel import ControlChannel

MAGIC = 0x52534D52_494E4701  # "RSMRING" + format version 1
NUM_SLOTS, SLOT_BYTES = 16, 64 * 1024  # 1 MiB; a 4096-token prefill plan is about 20 KB
CHUNK_HEADER = 32  # ready, message length, chunk length, crc
LINE = 64
SPIN_S = 0.0005  # spin this long before napping: a plan that follows soon arrives at once
NAP_S = 50e-6  # then poll this often (a nap lasts 50-100 us on Linux)...
IDLE_AFTER_S, IDLE_NAP_S = 0.1, 0.001  # ...and after this long without a plan, this often
CORRUPT_AFTER_S = 1.0  # a chunk whose checksum still fails after this is corrupt
STORE_KEY = "control/shm"  # the segment's name, set by rank 0 in the TCP store


def _wait_until(ready: Callable[[], bool], check: Callable[[], None] | None = None) -> None:
    """Return once `ready()` is true: spin for SPIN_S, then nap, calling `check` (which may raise)
    before each nap."""
    if ready():
        return
    start = time.perf_counter()
    while not ready():
        waited = time.perf_counter() - start
        if waited > SPIN_S:
            if check is not None:
                check()
            time.sleep(NAP_S if waited < IDLE_AFTER_S else IDLE_NAP_S)


class ShmRingChannel(ControlChannel):
    def __init__(self, rank: int, world_size: int, store: dist.Store,
                 guard: CollectiveGuard) -> None:
        self.rank, self.guard = rank, guard
        if rank == 0:
            size = LINE * (1 + world_size) + NUM_SLOTS * SLOT_BYTES
            self.shm = shared_memory.SharedMemory(create=True, size=size)
        else:
            self.shm = shared_memory.SharedMemory(name=store.get(STORE_KEY).decode())
            # Only rank 0 owns the segment: without this, Python 3.11's tracker in this process
            # would unlink it when the follower exits.
            resource_tracker.unregister(self.shm._name, "shared_memory")  # type: ignore[attr-defined]
        self._buf = self.shm.buf
        self._words = self._buf.cast("Q")
        w = self._words
        if rank == 0:
            w[0], w[1], w[2], w[3] = MAGIC, NUM_SLOTS, SLOT_BYTES, world_size
            store.set(STORE_KEY, self.shm.name)
        elif (w[0], w[3]) != (MAGIC, world_size):
            raise RuntimeError(f"shared-memory control segment {self.shm.name} is not a ring for "
                               f"{world_size} ranks")
        self.world_size, self.num_slots, self.slot_bytes = world_size, w[1], w[2]
        self.header = LINE * (1 + world_size)
        self._next = 0  # next chunk sequence number: to write (rank 0), to read (followers)

    def _slot(self, s: int) -> int:
        """Byte offset of the slot that holds chunk s."""
        return self.header + (s % self.num_slots) * self.slot_bytes

    @staticmethod
    def _crc(s: int, total: int, payload: bytes | memoryview) -> int:
        return zlib.crc32(payload, zlib.crc32(struct.pack("<QQQ", s, total, len(payload))))

    # -- rank 0 ---------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.guard.check()
        view, room = memoryview(data), self.slot_bytes - CHUNK_HEADER
        for start in range(0, max(len(data), 1), room):
            self._put(self._next, len(data), view[start : start + room])
            self._next += 1

    def _put(self, s: int, total: int, payload: memoryview) -> None:
        if s >= self.num_slots:  # the slot holds chunk s - num_slots until every follower read it
            w, lines = self._words, range(1, self.world_size)
            free = lambda: min(w[8 * (1 + r) + 1] for r in lines) > s - self.num_slots
            _wait_until(free, self.guard.check)
        off, n = self._slot(s), len(payload)
        w0 = off // 8
        self._words[w0 + 1], self._words[w0 + 2] = total, n
        self._words[w0 + 3] = self._crc(s, total, payload)
        self._buf[off + CHUNK_HEADER : off + CHUNK_HEADER + n] = payload
        self._words[w0] = s + 1  # last: readers wait for this word

    # -- followers ------------------------------------------------------------------------------
    def recv(self) -> bytes:
        total, part = self._get()
        parts, got = [part], len(part)
        while got < total:
            total, part = self._get()
            parts.append(part)
            got += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _get(self) -> tuple[int, bytes]:
        s = self._next
        off = self._slot(s)
        w0, w = off // 8, self._words
        _wait_until(lambda: w[w0] == s + 1)
        deadline = None
        while True:
            total, n, crc = w[w0 + 1], w[w0 + 2], w[w0 + 3]
            if n <= self.slot_bytes - CHUNK_HEADER:
                payload = bytes(self._buf[off + CHUNK_HEADER : off + CHUNK_HEADER + n])
                if self._crc(s, total, payload) == crc:
                    break
            # a view that has not settled yet settles within microseconds; one that never does is
            # a corrupt segment, and replaying a wrong plan would be worse than stopping
            deadline = deadline or time.monotonic() + CORRUPT_AFTER_S
            if time.monotonic() > deadline:
                raise TPGroupError(f"rank {self.rank}: control chunk {s} fails its checksum")
        w[8 * (1 + self.rank) + 1] = s + 1  # consumed: rank 0 may reuse the slot
        self._next = s + 1
        return total, payload

    # -- heartbeats and teardown ----------------------------------------------------------------
    def beat(self) -> None:
        self._words[8 * (1 + self.rank)] += 1  # only this rank's heartbeat thread writes it

    def beats(self) -> list[int]:
        return [self._words[8 * (1 + r)] for r in range(self.world_size)]

    def close(self) -> None:
        if self._buf is None:
            return
        self._words.release()
        self._buf.release()
        self._buf = None  # type: ignore[assignment]
        self.shm.close()
        if self.rank == 0:
            self.shm.unlink()
