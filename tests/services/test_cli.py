"""The command line (`services/cli.py`): engine flags survive the trip to the scheduler child;
replica and routing flags."""

from __future__ import annotations

import pytest


def test_cli_engine_flags_round_trip_to_the_scheduler_child() -> None:
    from radixserve.services.cli import build_parser, engine_argv, engine_config

    args = build_parser().parse_args(
        ["serve", "--no-overlap", "--cache", "naive", "--page-size", "8", "--num-pages", "64"])
    engine = engine_config(args, "/models/x")
    child = build_parser().parse_args(["scheduler", *engine_argv(engine)])
    assert engine_config(child, "/models/x") == engine
    assert not engine.overlap and engine.cache == "naive" and engine.num_pages == 64


def test_cli_pdl_is_an_on_off_switch_that_reaches_the_child() -> None:
    from radixserve.services.cli import build_parser, engine_argv, engine_config

    parser = build_parser()
    assert engine_config(parser.parse_args(["serve"]), "/m").pdl  # on unless turned off
    engine = engine_config(parser.parse_args(["serve", "--pdl", "off"]), "/m")
    assert not engine.pdl
    assert not engine_config(parser.parse_args(["scheduler", *engine_argv(engine)]), "/m").pdl
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--pdl", "maybe"])


def test_cli_serve_takes_replicas_and_routing() -> None:
    from radixserve.services.cli import build_parser

    args = build_parser().parse_args(["serve", "--dp-size", "2", "--routing", "round_robin",
                                      "--tp-size", "2"])
    assert (args.dp_size, args.routing, args.tp_size) == (2, "round_robin", 2)
    defaults = build_parser().parse_args(["serve"])
    assert (defaults.dp_size, defaults.routing) == (1, "cache_aware")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--routing", "random"])


def test_cli_gateways_are_auto_or_a_count() -> None:
    from radixserve.services.children import resolve_gateways
    from radixserve.services.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).gateways == "auto"
    assert parser.parse_args(["serve", "--gateways", "3"]).gateways == 3
    for bad in ("0", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--gateways", bad])
    assert resolve_gateways(3, "cuda") == 3
    assert resolve_gateways("auto", "cpu") == 1


def test_cli_routing_knobs_build_a_checked_routing_config(
        capsys: pytest.CaptureFixture[str]) -> None:
    from radixserve.services.cli import build_parser, routing_config

    args = build_parser().parse_args(["gateway", "--routing-balance-abs", "8",
                                      "--routing-cache-threshold", "0.25"])
    routing = routing_config(args)
    assert (routing.policy, routing.balance_abs, routing.cache_threshold) == (
        "cache_aware", 8, 0.25)
    bad = build_parser().parse_args(["serve", "--routing-balance-rel", "0.5"])
    with pytest.raises(SystemExit, match="balance_rel .* must be >= 1.0"):
        routing_config(bad)


def test_cli_gateway_backends_repeat_and_default_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.services.cli import build_parser

    monkeypatch.setenv("RADIXSERVE_SCHEDULER_ADDR", "sched-a:1, sched-b:1")
    monkeypatch.setenv("RADIXSERVE_DETOKENIZER_ADDR", "detok:1")
    args = build_parser().parse_args(["gateway"])
    assert args.scheduler_addr == ["sched-a:1", "sched-b:1"]  # comma-separated: one per replica
    assert args.detokenizer_addr == ["detok:1"]
    assert args.routing == "cache_aware"
    # Flags replace the environment's list instead of adding to it.
    args = build_parser().parse_args(["gateway", "--scheduler-addr", "x:1", "--scheduler-addr",
                                      "y:1", "--routing", "least_load"])
    assert args.scheduler_addr == ["x:1", "y:1"] and args.detokenizer_addr == ["detok:1"]
    assert args.routing == "least_load"
    # The scheduler keeps its single detokenizer.
    assert build_parser().parse_args(["scheduler"]).detokenizer_addr == "detok:1"


def test_cli_connection_age_defaults_with_gateway_recycling() -> None:
    """Recycling needs connections that age out: 30 s unless given; without recycling, never."""
    from radixserve.services.cli import _connection_age, build_parser

    parse = build_parser().parse_args
    assert _connection_age(parse(["serve"])) == 0.0
    assert _connection_age(parse(["serve", "--gateways", "2", "--gateway-recycle-s", "600"])) == 30
    assert _connection_age(parse(["serve", "--gateway-recycle-s", "600",
                                  "--max-connection-age", "5"])) == 5.0
    assert _connection_age(parse(["serve", "--max-connection-age", "120"])) == 120.0
    assert parse(["gateway", "--max-connection-age", "5"]).max_connection_age == 5.0
