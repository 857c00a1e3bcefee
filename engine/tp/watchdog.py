"""Rank 0's watch over the follower ranks: one that exits or stops running becomes a TPGroupError
naming it within seconds, whatever rank 0 is blocked in, instead of at a collective's timeout.

A thread checks every CHECK_S that each worker process still runs (`Popen.poll`) and that its
heartbeat count (`ControlChannel.beats`, bumped every HEARTBEAT_S by a thread of the worker) grew
within SILENT_AFTER_S. On the first problem it records it in the guard (the next `check` or
collective on rank 0 raises it), kills a silent worker, and aborts the communicator:

- gloo: a collective waiting for a dead peer fails once the peer's sockets close, which the kill
  brings about for a stopped one (a plain timeout would take `tp_timeout_s`);
- NCCL: a dead peer is never noticed by the library itself; the abort ends the kernels that wait
  for it, so rank 0's wait for its step returns and `TPLeader.check` raises.

A count that never moved is a worker still starting (imports, loading): start-up has its own limits
(launch.START_TIMEOUT_S) and exits are still seen at once.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time

from radixserve.engine.distributed import CollectiveGuard, Communicator
from radixserve.engine.tp.channel import HEARTBEAT_S, ControlChannel

log = logging.getLogger(__name__)
CHECK_S = 0.25
SILENT_AFTER_S = 6 * HEARTBEAT_S  # 3 s: detection within CHECK_S + 3 s, inside a 5 s target


class Watchdog:
    def __init__(self, workers: list[subprocess.Popen], channel: ControlChannel,
                 guard: CollectiveGuard, comm: Communicator) -> None:
        self.workers, self.channel, self.guard, self.comm = workers, channel, guard, comm
        self.diagnosis: str | None = None  # what went wrong, naming the rank
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tp-watchdog")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Before a normal shutdown, whose exits are not failures."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        counts = self.channel.beats()
        changed = [time.monotonic()] * len(counts)
        while not self._stop.wait(CHECK_S):
            rank, problem = self._find(counts, changed)
            if problem is not None:
                self._fail(rank, problem)
                return

    def _find(self, counts: list[int], changed: list[float]) -> tuple[int, str | None]:
        """(rank, what is wrong with it), or (0, None); updates `counts` and `changed` in place."""
        for rank, p in enumerate(self.workers, 1):
            code = p.poll()
            if code is not None:
                return rank, f"worker rank {rank} exited with code {code}"
        now, beats = time.monotonic(), self.channel.beats()
        for rank in range(1, len(beats)):
            if beats[rank] != counts[rank]:
                counts[rank], changed[rank] = beats[rank], now
            elif counts[rank] > 0 and now - changed[rank] > SILENT_AFTER_S:
                return rank, (f"worker rank {rank} sent no heartbeat for {now - changed[rank]:.1f} "
                              "s (stopped or frozen); it was killed")
        return 0, None

    def _fail(self, rank: int, problem: str) -> None:
        log.error("tensor-parallel group failed: %s", problem)
        self.diagnosis = problem
        self.guard.fail(f"tensor-parallel group failed: {problem}")
        worker = self.workers[rank - 1]
        if worker.poll() is None:
            worker.kill()
        self.comm.abort()
