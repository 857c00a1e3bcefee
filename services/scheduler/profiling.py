"""A benchmark hook, a no-op unless RADIXSERVE_PROFILE_ENGINE is set: cProfile of the scheduler
process from the engine loop's start, written where that variable says (one file per scheduler
process: PATH.PID).

The engine thread's host phases (engine/step_times.py) say which phase of a step is long; this
says which functions make it so, in the served engine, beside the gRPC event loop and its
traffic, where `bench profile` times the same phases alone. Up to Python 3.11 cProfile hooks only
the thread that enables it (the engine loop's); from 3.12 it sees every thread, so the event
loop's functions (services/scheduler/server.py, convert.py, grpc's) are in the file too. It slows
the Python it profiles (about twofold), so its shares count, not its times; a run with it is for
reading, not for figures.
The file is rewritten every DUMP_EVERY iterations and when the loop ends, so a stack that is
killed still leaves what came before. Read it with `pstats` (bench/gpu_check.sh `pstats:` stage).
"""

from __future__ import annotations

import cProfile
import logging
import os

log = logging.getLogger(__name__)

ENV = "RADIXSERVE_PROFILE_ENGINE"
DUMP_EVERY = 2000  # loop iterations between two writes of the file


class EngineProfile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._profile = cProfile.Profile()
        self._iterations = 0

    @classmethod
    def from_env(cls) -> EngineProfile | None:
        base = os.environ.get(ENV)
        return cls(f"{base}.{os.getpid()}") if base else None

    def start(self) -> None:
        """Profile from now on: the calling thread (the engine loop's), every thread from 3.12."""
        log.warning("profiling the engine loop into %s (%s is set)", self.path, ENV)
        self._profile.enable()

    def iterated(self) -> None:
        self._iterations += 1
        if self._iterations % DUMP_EVERY == 0:
            self.dump()
            self._profile.enable()

    def dump(self) -> None:
        """Write what was profiled so far (profiling stops; `start` again to go on)."""
        self._profile.disable()
        self._profile.dump_stats(self.path)
