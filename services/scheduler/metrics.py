"""Prometheus view of the engine loop's stats snapshot, computed at scrape time.

Two collectors, each naming its metrics (`describe`), so a scrape that asks for some metrics by
name (`/metrics?name[]=radixserve_running_requests&...`, as `bench abort` polls every few
milliseconds) builds only the collector that has them: the counts are cheap, the step and phase
histograms are most of a full scrape's work, which the process's other threads wait out."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from radixserve.engine.step_times import BOUNDS, HOST_BOUNDS
from radixserve.services.common import gc_pauses


class _SnapshotCollector(Collector):
    """Reads the latest snapshot; never touches the engine (it lives on another thread)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Any]:
        """Its metrics, whatever the snapshot holds (read once, when registered)."""
        return self._families({})

    def collect(self) -> Iterator[Any]:
        return self._families(self._snapshot())

    @abstractmethod
    def _families(self, s: dict[str, Any]) -> Iterator[Any]:
        """Its metric families from snapshot `s` (every family, whatever `s` holds)."""


class EngineCountsCollector(_SnapshotCollector):
    """The loop's gauges and counters."""

    def _families(self, s: dict[str, Any]) -> Iterator[Any]:
        total = s.get("kv_pages_total", 0)
        free = s.get("kv_pages_free", 0) + s.get("kv_pages_evictable", 0)
        prompt = s.get("prompt_tokens_total", 0)
        yield GaugeMetricFamily(
            "radixserve_queue_depth", "Requests waiting for admission", s.get("waiting_requests", 0)
        )
        yield GaugeMetricFamily(
            "radixserve_running_requests", "Requests in the running batch",
            s.get("running_requests", 0)
        )
        yield GaugeMetricFamily("radixserve_kv_pages_total", "KV cache pages", total)
        yield GaugeMetricFamily(
            "radixserve_kv_page_usage", "Share of KV pages held by running requests",
            (total - free) / total if total else 0.0,
        )
        yield GaugeMetricFamily(
            "radixserve_prefix_cache_hit_rate",
            "Share of prompt tokens served from the prefix cache",
            s.get("cached_tokens_total", 0) / prompt if prompt else 0.0,
        )
        yield CounterMetricFamily(
            "radixserve_prompt_tokens", "Prompt tokens admitted", prompt
        )
        yield CounterMetricFamily(
            "radixserve_engine_steps", "Engine steps run by the scheduler loop",
            s.get("engine_steps_total", 0),
        )
        paths = CounterMetricFamily(
            "radixserve_engine_forwards",
            "Engine forwards by how they ran: decode_graph (every row one token in the decode "
            "graphs), whole_graph (the piecewise graphs with every row attended inside), pieces "
            "(attention between the pieces), eager", labels=["path"])
        for path, count in s.get("forward_paths", {}).items():
            paths.add_metric([path], count)
        yield paths
        yield GaugeMetricFamily(
            "radixserve_engine_steps_at_last_free",
            "Engine steps run when an abort last freed a request (what bench abort counts from)",
            s.get("engine_steps_at_last_free", 0),
        )
        yield GaugeMetricFamily(
            "radixserve_decode_step_seconds",
            "The engine's recent decode step, as it measures its steps (0: none seen yet)",
            s.get("decode_step_us", 0) / 1e6,
        )
        yield GaugeMetricFamily(
            "radixserve_mixed_prefill_cap",
            "Prefill budget of a step that decodes, by mixed_step_ratio (0: off or not learned)",
            s.get("mixed_prefill_cap", 0),
        )
        yield GaugeMetricFamily(
            "radixserve_long_prompt_chunk",
            "Chunk of a prompt longer than a step, beside decodes, by long_prompt_slack "
            "(0: its chunks fill max_prefill_tokens)",
            s.get("long_prompt_chunk", 0),
        )
        yield CounterMetricFamily(
            "radixserve_engine_thread_cpu_seconds",
            "CPU time of the engine loop's thread (against its host phases' wall time: the time "
            "it waited for the interpreter)", s.get("engine_thread_cpu_seconds", 0.0),
        )
        yield CounterMetricFamily(
            "radixserve_retractions",
            "Running requests sent back to the queue under KV pressure (outputs unchanged)",
            s.get("retractions_total", 0),
        )


# (name, help, label, bounds, snapshot key) of the TimeHistograms the engine and its loop keep
_TIME_HISTOGRAMS = (
    ("radixserve_engine_step_seconds",
     "Engine steps that decoded, from the previous step's read to their own (the gap each running "
     "stream saw); kind: mixed (they also prefilled) or decode", "kind", BOUNDS, "step_seconds"),
    ("radixserve_engine_mixed_step_seconds",
     "The engine steps that decoded beside prefill, by their prefill (budget units: tokens under "
     "the default budget)", "prefill", BOUNDS, "mixed_step_seconds"),
    ("radixserve_engine_host_seconds",
     "The engine thread's time in each phase of a step: loop (between steps), schedule, launch, "
     "commands, wait (for the device), process", "phase", HOST_BOUNDS, "host_seconds"),
    ("radixserve_abort_seconds",
     "From the scheduler receiving an abort to the engine having freed its request; source: "
     "gateway (a client's cancel, a deadline, the Abort RPC) or stop_string (the detokenizer "
     "matched one)", "source", HOST_BOUNDS, "abort_seconds"),
)


class EngineTimesCollector(_SnapshotCollector):
    """The engine's step and host-phase histograms, and the loop's abort times."""

    def _families(self, s: dict[str, Any]) -> Iterator[Any]:
        for name, doc, label, bounds, key in _TIME_HISTOGRAMS:
            yield _histogram(name, doc, label, bounds, s.get(key, {}))


def _histogram(name: str, doc: str, label: str, bounds: tuple[float, ...],
               snapshot: dict[str, tuple[tuple[int, ...], float]]) -> HistogramMetricFamily:
    """A TimeHistogram's snapshot (engine/step_times.py) as a Prometheus histogram."""
    family = HistogramMetricFamily(name, doc, labels=[label])
    for value, (counts, total) in snapshot.items():
        running, buckets = 0, []
        for bound, count in zip((*(f"{b:.6g}" for b in bounds), "+Inf"), counts):
            running += count
            buckets.append((bound, running))
        family.add_metric([value], buckets, total)
    return family


def scheduler_registry(snapshot: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """The scheduler's metrics, read from the loop's stats `snapshot` at each scrape."""
    registry = CollectorRegistry()
    registry.register(EngineCountsCollector(snapshot))
    registry.register(EngineTimesCollector(snapshot))
    gc_pauses.register(registry)  # a collection holds the engine thread too
    return registry


def serve_metrics(port: int, snapshot: Callable[[], dict[str, Any]], host: str = "0.0.0.0") -> None:
    start_http_server(port, addr=host, registry=scheduler_registry(snapshot))
