"""Prometheus metrics of the gateway: requests by status, TTFT / TPOT / E2E latency, how long a
step's tokens take from the scheduler to the client streams, and each scheduler replica's state
and load (label `replica`: its address)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from radixserve.services.common import gc_pauses
from radixserve.services.gateway.types import ReplicaReport, StepTimes

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0
)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
# a fraction of a decode step to many steps
_HOP_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
                1.024)
# 0.5 ms to 5 s, each bound 1.1 times the one before: an inter-token quantile read within a bucket
# is a few percent off at most, close enough for a p99 / p50 ratio against a goal of 2
_ITL_BUCKETS = tuple(round(0.0005 * 1.1**k, 7) for k in range(97))


class GatewayMetrics:
    """One registry per gateway, so several gateways (tests) never collide on global state."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "radixserve_requests",
            "Finished RPCs by method and final status code",
            ["method", "code"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "radixserve_generate_in_flight", "Generate calls in progress", registry=self.registry
        )
        self.ttft = Histogram(
            "radixserve_time_to_first_token_seconds",
            "Time from receiving a Generate call to its first token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "radixserve_time_per_output_token_seconds",
            "Mean time between output tokens after the first, per request",
            buckets=_TPOT_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "radixserve_e2e_request_latency_seconds",
            "Time from receiving a Generate call to its last event",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.completion_tokens = Counter(
            "radixserve_completion_tokens", "Generated tokens", registry=self.registry
        )
        # Each from the scheduler's wall clock to another's: on several hosts, their skew too.
        self.step_received = Histogram(
            "radixserve_step_detokenizer_received_delay_seconds",
            "From the scheduler having an engine step's outputs to the detokenizer receiving the "
            "step (of the steps that reach this gateway)",
            buckets=_HOP_BUCKETS,
            registry=self.registry,
        )
        self.step_detokenized = Histogram(
            "radixserve_step_detokenized_delay_seconds",
            "From the scheduler having an engine step's outputs to the detokenizer having "
            "detokenized them (of the steps that reach this gateway)",
            buckets=_HOP_BUCKETS,
            registry=self.registry,
        )
        self.step_arrival = Histogram(
            "radixserve_step_arrival_delay_seconds",
            "From the scheduler having an engine step's outputs to this gateway receiving them "
            "from the detokenizer",
            buckets=_HOP_BUCKETS,
            registry=self.registry,
        )
        self.token_handoff = Histogram(
            "radixserve_token_handoff_delay_seconds",
            "From the scheduler having an engine step's outputs to this gateway handing a "
            "stream's message with them to gRPC (the earliest step of a message that joins "
            "several)",
            buckets=_HOP_BUCKETS,
            registry=self.registry,
        )
        self.inter_token = Histogram(
            "radixserve_inter_token_latency_seconds",
            "Time between consecutive messages with tokens of one completion, as this gateway "
            "handed them to gRPC (the server's part of the inter-token latency a client sees)",
            buckets=_ITL_BUCKETS,
            registry=self.registry,
        )
        self.abort_sent = Histogram(
            "radixserve_abort_sent_seconds",
            "From this gateway ending a request early (a client's cancel, a deadline, the Abort "
            "RPC) to its abort written to the scheduler's Submit stream",
            buckets=_HOP_BUCKETS,
            registry=self.registry,
        )
        self.routed = Counter(
            "radixserve_replica_routed_requests", "Completions sent to each scheduler replica",
            ["replica"], registry=self.registry,
        )

    def watch_replicas(self, reports: Callable[[], list[ReplicaReport]]) -> None:
        """Export each replica's state and last polled load, read at scrape time."""
        self.registry.register(_ReplicaCollector(reports))

    def on_status(self, method: str, code: grpc.StatusCode) -> None:
        self.requests.labels(method=method, code=code.name).inc()

    def on_finished(self, ttft_s: float | None, e2e_s: float, completion_tokens: int) -> None:
        self.e2e.observe(e2e_s)
        self.completion_tokens.inc(completion_tokens)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            if completion_tokens > 1:
                self.tpot.observe((e2e_s - ttft_s) / (completion_tokens - 1))

    def on_step_arrival(self, times: StepTimes) -> None:
        """A step reached this gateway: how long after the scheduler had it each point of its way
        saw it."""
        if not times.scheduled:
            return
        now = time.time_ns()
        for histogram, at in ((self.step_received, times.received),
                              (self.step_detokenized, times.detokenized), (self.step_arrival, now)):
            if at:
                histogram.observe(max(0, at - times.scheduled) / 1e9)

    def on_token_handoff(self, step_unix_ns: int, gap_s: float | None) -> None:
        """A stream's message with tokens goes to gRPC: from its step (`step_unix_ns`, the
        scheduler's wall clock; 0: unknown) and from the stream's previous such message (`gap_s`;
        None: its first)."""
        if step_unix_ns:
            self.token_handoff.observe(max(0, time.time_ns() - step_unix_ns) / 1e9)
        if gap_s is not None:
            self.inter_token.observe(gap_s)

    def serve_http(self, port: int, host: str = "0.0.0.0") -> None:
        gc_pauses.register(self.registry)  # a collection holds every stream's hand-off
        start_http_server(port, addr=host, registry=self.registry)


# (metric suffix, help, value of a report); the load figures are absent until its first poll.
_REPLICA_GAUGES: tuple[tuple[str, str, Callable[[ReplicaReport], float | None]], ...] = (
    ("serving", "1 while the replica gets new requests", lambda r: float(r.serving)),
    ("in_flight_requests", "Completions of this gateway the replica holds",
     lambda r: r.in_flight),
    ("running_requests", "Requests running on the replica (all gateways)",
     lambda r: None if r.stats is None else r.stats.running_requests),
    ("waiting_requests", "Requests queued on the replica (all gateways)",
     lambda r: None if r.stats is None else r.stats.waiting_requests),
    ("kv_pages_free", "Free KV pages of the replica",
     lambda r: None if r.stats is None else r.stats.kv_pages_free),
    ("prefix_cache_hit_rate", "Share of the replica's prompt tokens served from its cache",
     lambda r: None if r.stats is None or not r.stats.prompt_tokens_total
     else r.stats.cached_tokens_total / r.stats.prompt_tokens_total),
)


class _ReplicaCollector(Collector):
    def __init__(self, reports: Callable[[], list[ReplicaReport]]) -> None:
        self._reports = reports

    def collect(self) -> Iterator[GaugeMetricFamily]:
        reports = self._reports()
        for suffix, help_text, value in _REPLICA_GAUGES:
            family = GaugeMetricFamily(f"radixserve_replica_{suffix}", help_text,
                                       labels=["replica"])
            for report in reports:
                v = value(report)
                if v is not None:
                    family.add_metric([report.address], float(v))
            yield family
