"""The queue of requests waiting for a slot, and how many of them are long prompts.

The scheduler gives long prompts (too long for one step's budget) one chunk a step for each that
is pending, so it needs their count every step; counting as requests enter and leave keeps that
O(1) where the queue holds thousands.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterator

from radixserve.engine.request import Req


class WaitingQueue:
    """First come first served, with a retracted request put back first in line."""

    def __init__(self, is_long: Callable[[Req], bool]) -> None:
        self._reqs: deque[Req] = deque()
        self._is_long = is_long  # must not change while a request waits
        self.long = 0  # how many waiting requests is_long

    def append(self, req: Req) -> None:
        self._reqs.append(req)
        self.long += self._is_long(req)

    def appendleft(self, req: Req) -> None:
        self._reqs.appendleft(req)
        self.long += self._is_long(req)

    def remove(self, req: Req) -> None:
        self._reqs.remove(req)
        self.long -= self._is_long(req)

    def __iter__(self) -> Iterator[Req]:
        return iter(self._reqs)

    def __len__(self) -> int:
        return len(self._reqs)

    def __getitem__(self, i: int) -> Req:
        return self._reqs[i]

    def check_integrity(self) -> None:
        long = sum(map(self._is_long, self._reqs))
        assert self.long == long, f"{self.long} long prompts counted, {long} waiting"
