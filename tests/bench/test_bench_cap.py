"""`radixserve bench cap` drives the engine's own StepCost with modelled steps: the cap it
reports settles where the ratio puts it, and the steps are those of the model."""

from __future__ import annotations

import pytest
from radixserve.bench import cap


def _args(*flags: str):
    return cap.parse_args(["--steps", "5000", "--seeds", "1", *flags])


def test_the_cap_settles_at_the_ratios_bound() -> None:
    """A decode step of 3.4 ms, a prompt of 384 tokens on average costing 0.4 ms + 2 us a token:
    at a ratio of 1.5 the allowance is 1.7 ms, which one prompt's cost per token fills at
    1.7 / (1.168 / 384) = 559 tokens."""
    r = cap.simulate(_args(), seed=0)
    assert r["cap"]["p50"] == pytest.approx(559, rel=0.05)
    assert r["step_ms"]["p50"] == pytest.approx(3.4, abs=0.3)  # most steps only decode
    assert 0.1 < r["mixed_share"] < 0.3  # about one arrival every five steps
    assert r["mixed_ms"]["p50"] == pytest.approx(3.4 + 1.17, abs=0.3)


def test_a_host_floor_holds_every_step_with_prefill_and_the_cap_within_the_budget() -> None:
    r = cap.simulate(_args("--host-floor-ms", "7", "--noise", "gauss", "--noise-ms", "0.1",
                           "--max-prefill-tokens", "2048"), seed=1)
    assert r["mixed_ms"]["p50"] == pytest.approx(7.0)
    assert r["cap"]["max"] <= 2048
    assert r["wait_steps"]["p99"] <= 1  # prompts enter whole: the host's fixed time is paid once
