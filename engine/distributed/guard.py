"""One rank's view of its group's health: every collective and control message runs through it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from radixserve.engine.distributed.comm import TPGroupError

T = TypeVar("T")


class CollectiveGuard:
    """Runs collectives for one rank. The first failure becomes a TPGroupError that says which
    peer went away (`describe`); after it every call fails at once, since the group is unusable.

    `fail` records a failure found elsewhere (a watchdog thread that saw a peer die); the owner's
    next `check` or `run` raises it. `failure` is written once, so it needs no lock.
    """

    def __init__(self, rank: int, describe: Callable[[], str]) -> None:
        self.rank, self.describe = rank, describe
        self.failure: str | None = None

    def fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message

    def check(self) -> None:
        if self.failure is not None:
            raise TPGroupError(self.failure)

    def run(self, what: str, fn: Callable[[], T]) -> T:
        self.check()
        try:
            return fn()
        except RuntimeError as e:  # DistBackendError, gloo I/O errors and timeouts all land here
            cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.fail(f"tensor-parallel {what} failed on rank {self.rank}: {self.describe()} "
                      f"({cause})")
            raise TPGroupError(self.failure) from e
