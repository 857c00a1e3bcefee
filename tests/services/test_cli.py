"""The command line (`services/cli.py`): engine flags survive the trip to the scheduler child."""

from __future__ import annotations


def test_cli_engine_flags_round_trip_to_the_scheduler_child() -> None:
    from radixserve.services.cli import build_parser, engine_argv, engine_config

    args = build_parser().parse_args(
        ["serve", "--no-overlap", "--cache", "naive", "--page-size", "8", "--num-pages", "64"])
    engine = engine_config(args, "/models/x")
    child = build_parser().parse_args(["scheduler", *engine_argv(engine)])
    assert engine_config(child, "/models/x") == engine
    assert not engine.overlap and engine.cache == "naive" and engine.num_pages == 64
