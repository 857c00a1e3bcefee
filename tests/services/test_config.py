"""`ServeConfig` (`services/config.py`): replicas and routing are checked when it is built."""

from __future__ import annotations

from typing import Any

import pytest


def _serve(device: str = "cpu", **fields: Any) -> Any:
    from radixserve.engine.config import EngineConfig
    from radixserve.services.config import ServeConfig
    from radixserve.services.gateway.frontend import FrontendConfig

    return ServeConfig(engine=EngineConfig(model_path="/m", device=device),
                       gateway=FrontendConfig(), **fields)


def test_replicas_and_routing_default_to_one_and_cache_aware() -> None:
    config = _serve()
    assert (config.dp_size, config.routing.policy) == (1, "cache_aware")


@pytest.mark.parametrize(("fields", "message"), [
    ({"dp_size": 0}, "dp_size must be >= 1"),
    ({"dp_size": -2}, "dp_size must be >= 1"),
    # the schedulers take the ports after the gateway's
    ({"dp_size": 3, "metrics_port": 65533}, r"metrics port must be in \(0, 65533\)"),
    ({"device": "cuda:1", "dp_size": 2}, "pins one GPU"),
])
def test_invalid_replica_settings_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _serve(**fields)


def test_metrics_ports_fit_every_replica() -> None:
    assert _serve(dp_size=3, metrics_port=65532).metrics_port == 65532
    assert _serve(device="cuda:1").dp_size == 1  # one replica may pin its GPU
