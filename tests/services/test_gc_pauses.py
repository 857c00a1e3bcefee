"""Each service's metrics time the garbage collector's pauses by generation, with one timer per
process however many registries export it."""

import gc

from prometheus_client import CollectorRegistry, generate_latest
from radixserve.bench.prometheus import Reading, observed_ms, parse
from radixserve.services.common import gc_pauses


def _reading(registry: CollectorRegistry) -> Reading:
    return Reading([parse(generate_latest(registry).decode())])


def test_collections_are_timed_by_generation() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    gc_pauses.register(first)
    callbacks = len(gc.callbacks)
    gc_pauses.register(second)  # a second registry shares the process's one timer
    assert len(gc.callbacks) == callbacks
    before = _reading(first)
    garbage = [[i] for i in range(50_000)]  # tracked objects for the collection to walk
    gc.collect()
    gc.collect(0)
    del garbage
    after = _reading(first)
    full = observed_ms(before, after, "radixserve_gc_pause_seconds", (("generation", "2"),))
    young = observed_ms(before, after, "radixserve_gc_pause_seconds", (("generation", "0"),))
    assert full["count"] >= 1 and full["mean"] > 0, full  # walking 50k objects takes time
    assert young["count"] >= 1, young
    assert _reading(second).total("radixserve_gc_pause_seconds_count", (("generation", "2"),)) \
        == after.total("radixserve_gc_pause_seconds_count", (("generation", "2"),))
