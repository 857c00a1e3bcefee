"""`bench abort --launch` finds the scheduler's metrics after the gateways' ports."""

from radixserve.bench import abort


def test_scheduler_metrics_port_skips_every_gateway() -> None:
    # serve puts gateway i on metrics_port + i and scheduler replica 0 right after the gateways
    assert abort._gateways(["--device", "cpu"]) == 1
    assert abort._gateways(["--device", "cuda", "--gateways", "2"]) == 2
    assert abort._gateways(["--gateways=3", "--device", "cuda"]) == 3
