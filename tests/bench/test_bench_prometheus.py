"""What the service benchmarks read from the services' Prometheus endpoints: the URLs serve's flags
give them, and the span of a histogram between two scrapes of real endpoints."""

import math

import pytest
from radixserve.bench.process import free_port_block
from radixserve.bench.prometheus import Reading, observed_ms, quantile, served_metrics
from radixserve.services.gateway.metrics import GatewayMetrics


def test_urls_follow_serve_ports_gateways_first_then_each_replica() -> None:
    flags, gateways, schedulers = served_metrics(["--device", "cuda", "--gateways", "2",
                                                  "--metrics-port", "9400", "--dp-size", "3"])
    assert flags[-2:] == ["--dp-size", "3"]  # given a port: the flags as they were
    assert gateways == ["http://127.0.0.1:9400/metrics", "http://127.0.0.1:9401/metrics"]
    assert schedulers == [f"http://127.0.0.1:{p}/metrics" for p in (9402, 9403, 9404)]


def test_flags_without_a_port_get_a_free_one() -> None:
    flags, gateways, schedulers = served_metrics(["--device", "cpu"])
    assert flags[0] == "--metrics-port" and flags[2:] == ["--device", "cpu"]
    port = int(flags[1])
    assert gateways == [f"http://127.0.0.1:{port}/metrics"]
    assert schedulers == [f"http://127.0.0.1:{port + 1}/metrics"]


def test_auto_gateways_are_counted_as_serve_counts_them() -> None:
    """`serve --gateways auto` (the default) on a GPU engine runs one per four host cores: each
    has a metrics port, and the schedulers' come after all of them."""
    import os

    from radixserve.services.children import auto_gateways

    _, gateways, schedulers = served_metrics(["--device", "cuda", "--metrics-port", "9400"])
    count = auto_gateways("cuda", os.environ)
    assert gateways == [f"http://127.0.0.1:{9400 + i}/metrics" for i in range(count)]
    assert schedulers == [f"http://127.0.0.1:{9400 + count}/metrics"]


def test_quantile_interpolates_within_the_bucket() -> None:
    buckets = {0.001: 10.0, 0.002: 30.0, 0.004: 40.0, math.inf: 40.0}
    assert quantile(0.25, buckets) == pytest.approx(0.001)  # rank 10: top of the first bucket
    assert quantile(0.5, buckets) == pytest.approx(0.0015)  # rank 20: half-way through the second
    assert quantile(0.125, buckets) == pytest.approx(0.0005)  # from 0 in the first
    assert quantile(1.0, {0.001: 1.0, math.inf: 2.0}) == pytest.approx(0.001)  # in +Inf: the bound
    assert math.isnan(quantile(0.5, {math.inf: 0.0}))


def test_span_between_two_scrapes_of_two_gateways() -> None:
    port = free_port_block(2)
    gateways = [GatewayMetrics(), GatewayMetrics()]
    for i, metrics in enumerate(gateways):
        metrics.serve_http(port + i, host="127.0.0.1")
        metrics.token_handoff.observe(0.5)  # before the span: not counted
    urls = [f"http://127.0.0.1:{port + i}/metrics" for i in range(2)]
    before = Reading.take(urls)
    for _ in range(98):
        gateways[0].token_handoff.observe(0.0015)
    for _ in range(2):
        gateways[1].token_handoff.observe(0.1)
    after = Reading.take(urls)
    span = observed_ms(before, after, "radixserve_token_handoff_delay_seconds")
    assert span["count"] == 100
    assert span["mean"] == pytest.approx((98 * 1.5 + 2 * 100) / 100)
    assert span["total_ms"] == pytest.approx(98 * 1.5 + 2 * 100)
    assert 1.0 < span["p50"] <= 2.0 and 1.0 < span["p90"] <= 2.0  # in the (1, 2] ms bucket
    assert 64 < span["p99"] <= 128  # the two slow messages, in (64, 128] ms
    arrivals = observed_ms(before, after, "radixserve_step_arrival_delay_seconds")
    assert arrivals["count"] == 0 and math.isnan(arrivals["p99"]) and arrivals["total_ms"] == 0
