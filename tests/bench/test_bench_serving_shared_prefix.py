"""bench serving's shared-prefix workload end to end, against a one-replica `radixserve serve`
started the way `--launch` starts it (CPU, the demo model, tiny sizes): a group's requests after
its first are served their prefix from the cache. No timing is asserted (a loaded 2-core machine
runs these)."""

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
    assert one["replicas"] == [] and one["routing"] == ""  # one scheduler, no replica rows
    printed = capsys.readouterr().out
    assert "srv cached" in printed and "replica" not in printed
    assert _idle(target)  # every page back in the pool, nothing held by the gateway


@pytest.mark.parametrize("argv", [
    ["--workload", "shared-prefix", "--prefix-len", "0"],
])
def test_bad_flags_are_refused_before_anything_starts(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        serving.main(argv)
    assert exit_.value.code == 2
