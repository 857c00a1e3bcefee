"""What the service benchmarks read from the services' Prometheus endpoints (serve --metrics-port):
one scrape of several endpoints, counters summed over them, and the histogram of what was observed
between two scrapes, with its quantiles estimated as Prometheus' `histogram_quantile` does (linear
within a bucket).
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# The scheduler's count of engine steps it has run (services/scheduler/metrics.py), as exposed.
ENGINE_STEPS = "radixserve_engine_steps_total"
Labels = tuple[tuple[str, str], ...]  # a sample's labels, sorted
Samples = dict[tuple[str, Labels], float]  # (sample name, its labels) -> value


def served_metrics(serve_flags: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(serve flags, gateway metrics URLs, scheduler metrics URLs) for `radixserve serve
    SERVE_FLAGS` on this host, read as serve parses its flags: gateway i serves on --metrics-port
    + i, then scheduler replica i on the port after the gateways'. Flags without --metrics-port get
    one, the first of enough free ports."""
    from radixserve.bench.process import free_port_block
    from radixserve.services.children import resolve_gateways
    from radixserve.services.cli import build_parser

    args = build_parser().parse_args(["serve", *serve_flags])
    gateways = resolve_gateways(args.gateways, args.device)
    first = args.metrics_port
    if first is None:
        first = free_port_block(gateways + args.dp_size)
        serve_flags = ["--metrics-port", str(first), *serve_flags]

    def urls(ports: range) -> list[str]:
        return [f"http://127.0.0.1:{port}/metrics" for port in ports]

    schedulers = first + gateways
    return (serve_flags, urls(range(first, schedulers)),
            urls(range(schedulers, schedulers + args.dp_size)))


def scrape(url: str, timeout_s: float = 5.0) -> Samples:
    """Every sample the endpoint at `url` exposes now."""
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return parse(reply.read().decode())


def parse(text: str) -> Samples:
    """Every sample of an exposition in Prometheus' text format."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@dataclass(frozen=True)
class Reading:
    """One scrape of each of several endpoints, in the order given."""

    endpoints: list[Samples]

    @classmethod
    def take(cls, urls: list[str]) -> Reading:
        return cls([scrape(url) for url in urls])

    def total(self, name: str, labels: Labels = ()) -> float:
        """The sample `name` with exactly `labels` (sorted pairs) summed over the endpoints that
        have it."""
        return sum(e.get((name, labels), 0.0) for e in self.endpoints)

    def buckets(self, histogram: str, labels: Labels = ()) -> dict[float, float]:
        """upper bound -> cumulative count of histogram `histogram` (base name, no suffix) with
        `labels` besides `le`, summed over the endpoints."""
        out: dict[float, float] = {}
        for samples in self.endpoints:
            for (name, pairs), value in samples.items():
                if name == f"{histogram}_bucket":
                    own = dict(pairs)
                    le = float(own.pop("le"))
                    if tuple(sorted(own.items())) == labels:
                        out[le] = out.get(le, 0.0) + value
        return out


def quantile(q: float, buckets: dict[float, float]) -> float:
    """The q-quantile of cumulative `buckets` (upper bound -> count), linear within the bucket it
    falls in, from 0 for the first; in the +Inf bucket, the largest finite bound. NaN when empty."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = le, count
    return lower


def observed_ms(before: Reading, after: Reading, histogram: str,
                labels: Labels = ()) -> dict[str, float]:
    """What histogram `histogram` (seconds; its series with `labels`) observed between two
    readings: count, total (its sum) in milliseconds, and mean, p50, p90 and p99 in milliseconds
    (NaN when it observed nothing)."""
    b0, b1 = before.buckets(histogram, labels), after.buckets(histogram, labels)
    span = {le: b1[le] - b0.get(le, 0.0) for le in b1}
    count = (after.total(f"{histogram}_count", labels)
             - before.total(f"{histogram}_count", labels))
    seconds = after.total(f"{histogram}_sum", labels) - before.total(f"{histogram}_sum", labels)
    return {"count": count, "total_ms": seconds * 1e3,
            "mean": seconds / count * 1e3 if count > 0 else math.nan,
            **{f"p{round(q * 100)}": quantile(q, span) * 1e3 for q in (0.5, 0.9, 0.99)}}
