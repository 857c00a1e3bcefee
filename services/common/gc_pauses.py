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

import gc
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class _GcTimer:
    def __init__(self) -> None:
        # registry=None: registered in each registry that exports it (`register`)
        self.histogram = Histogram(
            "radixserve_gc_pause_seconds",
            "Collections of Python's cyclic garbage collector in this process, by generation, "
            "each as long as it held the interpreter",
            ["generation"], buckets=BUCKETS, registry=None)
        self._by_generation = [self.histogram.labels(generation=str(g)) for g in range(3)]
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        # One collection runs at a time (it holds the interpreter): one start time suffices.
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._by_generation[info["generation"]].observe(time.perf_counter() - self._started)


_timer: _GcTimer | None = None
_lock = threading.Lock()


def register(registry: CollectorRegistry) -> None:
    """Export this process's collection pauses in `registry` (timing them from now on)."""
    global _timer
    with _lock:
        if _timer is None:
            _timer = _GcTimer()
    registry.register(_timer.histogram)
