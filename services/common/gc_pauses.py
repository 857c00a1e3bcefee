"""How long Python's cyclic garbage collector held this process, by generation.

A collection holds the interpreter: in the scheduler no engine step is prepared or read meanwhile
(a late step is a gap in every stream), in a gateway no message goes out. The startup objects are
frozen out of its reach (lifecycle.freeze_startup_objects); what is left is the objects the
service makes while it serves. prometheus_client's own GC collector counts collections but not
their length, which is what a latency tail needs.

One timer per process, installed by the first `register`: its callbacks run on every collection
(hundreds a second in a busy service, a few microseconds each), so a service registers it only
where it serves metrics.
"""

from __future__ import annotations

import bisect
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

BOUNDS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
GENERATIONS = 3


class _GcTimer(Collector):
    def __init__(self) -> None:
        # generation -> collections per bucket of BOUNDS, then +Inf (not cumulative)
        self._counts = [[0] * (len(BOUNDS) + 1) for _ in range(GENERATIONS)]
        self._sums = [0.0] * GENERATIONS
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        # One collection runs at a time (it holds the interpreter): one start time suffices.
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds, generation = time.perf_counter() - self._started, info["generation"]
        self._counts[generation][bisect.bisect_left(BOUNDS, seconds)] += 1
        self._sums[generation] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "radixserve_gc_pause_seconds",
            "Collections of Python's cyclic garbage collector in this process, by generation, "
            "each as long as it held the interpreter", labels=["generation"])
        for generation, counts in enumerate(self._counts):
            running, buckets = 0, []
            for bound, count in zip((*map(str, BOUNDS), "+Inf"), list(counts)):
                running += count
                buckets.append((bound, running))
            family.add_metric([str(generation)], buckets, self._sums[generation])
        yield family


_timer: _GcTimer | None = None
_lock = threading.Lock()


def register(registry: CollectorRegistry) -> None:
    """Export this process's collection pauses in `registry` (timing them from now on)."""
    global _timer
    with _lock:
        if _timer is None:
            _timer = _GcTimer()
    registry.register(_timer)
