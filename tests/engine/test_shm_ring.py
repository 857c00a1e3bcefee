"""The shared-memory control ring (engine/tp/shm_ring.py) between two channel ends in one process:
messages arrive whole and in order whatever their size (empty, one chunk, many chunks, more than
the whole ring), a full ring waits for the reader and gives up when the group has failed, a torn
or corrupt chunk is never used, heartbeats count, and close removes the segment."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist
from radixserve.engine.distributed import CollectiveGuard, TPGroupError
from radixserve.engine.tp import shm_ring
from radixserve.engine.tp.shm_ring import CHUNK_HEADER, NUM_SLOTS, SLOT_BYTES, ShmRingChannel

ROOM = SLOT_BYTES - CHUNK_HEADER


@pytest.fixture
def ends() -> Iterator[tuple[ShmRingChannel, ShmRingChannel]]:
    store = dist.HashStore()
    guard = CollectiveGuard(0, lambda: "test")
    leader = ShmRingChannel(0, 2, store, guard)
    follower = ShmRingChannel(1, 2, store, CollectiveGuard(1, lambda: "test"))
    yield leader, follower
    follower.close()
    leader.close()


def test_messages_of_every_size_arrive_whole_and_in_order(ends):
    leader, follower = ends
    rng = random.Random(0)
    sizes = [0, 1, 18, ROOM - 1, ROOM, ROOM + 1, 3 * ROOM + 5] + [rng.randrange(5000)
                                                                    for _ in range(3 * NUM_SLOTS)]
    for n in sizes:  # one at a time: the ring wraps around many times
        data = rng.randbytes(n)
        leader.send(data)
        assert follower.recv() == data


def test_a_message_larger_than_the_ring_streams_through_it(ends):
    leader, follower = ends
    big = random.Random(1).randbytes(NUM_SLOTS * ROOM * 2 + 123)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(follower.recv() for _ in range(2)))
    reader.start()
    leader.send(big)
    leader.send(b"after")
    reader.join(30)
    assert got == [big, b"after"]


def test_a_full_ring_waits_and_fails_with_the_group(ends, monkeypatch):
    leader, follower = ends
    for i in range(NUM_SLOTS):  # fills every slot; nobody reads
        leader.send(bytes([i]))
    threading.Timer(0.2, leader.guard.fail, ["worker rank 1 exited with code -9"]).start()
    start = time.monotonic()
    with pytest.raises(TPGroupError, match="worker rank 1 exited"):
        leader.send(b"one too many")
    assert time.monotonic() - start >= 0.2
    assert [follower.recv() for _ in range(NUM_SLOTS)] == [bytes([i]) for i in range(NUM_SLOTS)]


def test_a_chunk_that_fails_its_checksum_is_not_used(ends, monkeypatch):
    leader, follower = ends
    leader.send(b"the plan of step 0")
    off = leader._slot(0) + CHUNK_HEADER
    leader._buf[off] ^= 0xFF  # as if the payload had not reached this reader yet
    threading.Timer(0.2, lambda: leader._buf.__setitem__(off, leader._buf[off] ^ 0xFF)).start()
    assert follower.recv() == b"the plan of step 0"  # retried until the payload settled
    leader.send(b"step 1")
    leader._buf[leader._slot(1) + CHUNK_HEADER] ^= 0xFF  # corrupt for good
    monkeypatch.setattr(shm_ring, "CORRUPT_AFTER_S", 0.1)
    with pytest.raises(TPGroupError, match="chunk 1 fails its checksum"):
        follower.recv()


def test_heartbeats_count_per_rank(ends):
    leader, follower = ends
    assert leader.beats() == [0, 0]
    for _ in range(3):
        follower.beat()
    assert leader.beats() == [0, 3]


def test_close_removes_the_segment():
    store = dist.HashStore()
    leader = ShmRingChannel(0, 2, store, CollectiveGuard(0, lambda: "test"))
    follower = ShmRingChannel(1, 2, store, CollectiveGuard(1, lambda: "test"))
    path = f"/dev/shm/{leader.shm.name}"
    assert os.path.exists(path)
    follower.close()  # a follower leaving does not remove it
    assert os.path.exists(path)
    leader.close()
    assert not os.path.exists(path)
