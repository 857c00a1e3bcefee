"""bench serving's shared-prefix workload end to end, against a one-replica `radixserve serve`
started the way `--launch` starts it (CPU, the demo model, tiny sizes): a group's requests after
its first are served their prefix from the cache, and --compare-routing gives each policy a
server of its own. No timing is asserted (a loaded 2-core machine runs these)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    assert one["replicas"] == [] and one["routing"] == ""  # one scheduler, no replica rows
    printed = capsys.readouterr().out
    assert "srv cached" in printed and "replica" not in printed
    assert _idle(target)  # every page back in the pool, nothing held by the gateway


def test_compare_routing_runs_each_policy_on_a_server_of_its_own(
        target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Today's `serve` takes no --routing: each launch gets the module's server, and the test
    checks what each would have been started with."""
    launched: list[list[str]] = []

    @contextlib.contextmanager
    def one_server(args: argparse.Namespace, flags: list[str]) -> Iterator[tuple[str, None]]:
        assert args.launch
        launched.append(flags)
        yield target, None

    monkeypatch.setattr(serving, "stack", one_server)
    out = tmp_path / "routing.json"
    code = serving.main(["--launch", *TINY, "--concurrency", "2", "--compare-routing",
                         "least_load,round_robin", "--json", str(out), "--", *SERVE_FLAGS])
    assert code == 0
    assert launched == [[*SERVE_FLAGS, "--routing", "least_load"],
                        [*SERVE_FLAGS, "--routing", "round_robin"]]
    data = json.loads(out.read_text())
    assert list(data["by_routing"]) == ["least_load", "round_robin"]
    for (level,) in data["by_routing"].values():
        assert level["completed"] == 9 and level["cached_share"] > 0
    printed = capsys.readouterr()
    table = printed.out[printed.out.index("routing       conc"):].splitlines()
    assert [row.split()[0] for row in table[2:4]] == ["least_load", "round_robin"]
    assert "the server reports" not in printed.err  # it names no policy, so no mismatch


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
