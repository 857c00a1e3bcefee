"""bench serving's shared-prefix workload end to end, against a one-replica `radixserve serve`
started the way `--launch` starts it (CPU, the demo model, tiny sizes): a group's requests after
its first are served their prefix from the cache, and --compare-routing gives each policy a
server of its own. No timing is asserted (a loaded 2-core machine runs these)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from radixserve.bench import serving
from radixserve.bench.process import stack, wait_idle
from radixserve.v1 import generate_pb2_grpc as pb_grpc

SERVE_FLAGS = ["--device", "cpu"]
# 3 groups x 3 requests, a 48-id prefix (three 16-token pages), 4 ids of their own, 4 out.
TINY = ["--workload", "shared-prefix", "--groups", "3", "--per-group", "3", "--prefix-len", "48",
        "--suffix-len", "4", "--output-len", "4"]


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with stack(argparse.Namespace(launch=True, model="demo", target=""), SERVE_FLAGS) as (t, _):
        yield t


def _idle(target: str) -> bool:
    async def check() -> bool:
        async with grpc.aio.insecure_channel(target) as channel:
            idle, _ = await wait_idle(pb_grpc.GenerateServiceStub(channel), timeout_s=60)
            return idle

    return asyncio.run(check())


def test_shared_prefix_requests_reuse_their_group_prefix(
        target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "shared.json"
    code = serving.main(["--target", target, *TINY, "--concurrency", "1,3", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["config"]["shared_prefix"] == {"groups": 3, "per_group": 3, "prefix_len": 48,
                                               "suffix_len": 4}
    one, three = data["results"]
    assert one["completed"] == three["completed"] == 9 and not one["failed"] + three["failed"]
    assert round(one["output_tok_s"] * one["duration_s"]) == 36  # exactly 4 tokens per request
    # One at a time, each group's 2nd and 3rd request find its 48 prefix ids cached: 6 * 48 of
    # 9 * 52 prompt ids (0.62). Three at a time, a twin may prefill beside its group's first.
    assert one["cached_share"] >= 0.5 and one["server_cached_share"] >= 0.5
    assert three["cached_share"] > 0 and three["server_cached_share"] > 0
    assert one["routing"] == "cache_aware" and len(one["replicas"]) == 1
    assert one["replicas"][0]["routed_requests"] == 9  # this level's requests only
    printed = capsys.readouterr().out
    assert "srv cached" in printed and "scheduler.sock serving" in printed
    assert _idle(target)  # every page back in the pool, nothing held by the gateway


def test_compare_routing_runs_each_policy_on_two_replicas_of_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each policy gets a fresh `serve --dp-size 2`: round robin splits every group over both
    replicas, cache-aware keeps a group on one, so it finds more of its prefixes cached."""
    out = tmp_path / "routing.json"
    code = serving.main(["--launch", *TINY, "--concurrency", "1", "--compare-routing",
                         "cache_aware,round_robin", "--json", str(out), "--", *SERVE_FLAGS,
                         "--dp-size", "2"])
    assert code == 0
    data = json.loads(out.read_text())
    assert list(data["by_routing"]) == ["cache_aware", "round_robin"]
    (aware,), (robin,) = data["by_routing"].values()
    for level, policy in ((aware, "cache_aware"), (robin, "round_robin")):
        assert level["completed"] == 9 and level["routing"] == policy
        assert len(level["replicas"]) == 2
    # One at a time: round robin sends a group's three requests to alternating replicas, so at
    # least one group prefills its prefix twice; cache-aware prefills each once (6 * 48 of 468).
    assert aware["cached_share"] == pytest.approx(6 * 48 / (9 * 52))
    assert robin["cached_share"] < aware["cached_share"]
    table = capsys.readouterr().out
    table = table[table.index("routing       conc"):].splitlines()
    assert [row.split()[0] for row in table[2:4]] == ["cache_aware", "round_robin"]


@pytest.mark.parametrize("argv", [
    ["--compare-routing"],  # needs --launch: each policy gets a fresh server
    ["--launch", "--compare-routing", "fastest"],
    ["--launch", "--compare-routing", "--", "--routing", "round_robin"],
    ["--workload", "shared-prefix", "--prefix-len", "0"],
])
def test_bad_flags_are_refused_before_anything_starts(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        serving.main(argv)
    assert exit_.value.code == 2
