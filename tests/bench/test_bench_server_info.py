"""What bench serving reads from GetServerInfo: cache shares from the totals before and after a
level, and each replica's load polled during it (against scripted replies: today's server runs
one scheduler and reports no replicas)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from radixserve.bench import serving
from radixserve.bench.server_info import (
    ReplicaLoad,
    ServerWatch,
    cached_share,
    replica_table,
    totals_share,
)
from radixserve.v1 import generate_pb2 as pb

SERVING, DOWN = pb.REPLICA_STATE_SERVING, pb.REPLICA_STATE_UNAVAILABLE


def test_cached_share_is_cached_over_prompt_tokens() -> None:
    assert cached_share(0, 0) == 0.0  # nothing seen yet, not a division by zero
    assert cached_share(288, 468) == pytest.approx(0.6154, abs=1e-4)
    before = pb.GetServerInfoResponse(cached_tokens_total=100, prompt_tokens_total=400)
    after = pb.GetServerInfoResponse(cached_tokens_total=388, prompt_tokens_total=868)
    assert totals_share(before, after) == cached_share(288, 468)  # only what the level added
    assert totals_share(after, after) == 0.0


def _replica(address: str, state: int = SERVING, running: int = 0, waiting: int = 0,
             routed: int = 0, cached: int = 0, prompt: int = 0) -> pb.ReplicaInfo:
    return pb.ReplicaInfo(address=address, state=state, running_requests=running,
                          waiting_requests=waiting, routed_requests=routed,
                          cached_tokens_total=cached, prompt_tokens_total=prompt)


class ScriptedStub:
    """GetServerInfo answers the scripted replies in turn (an exception is raised), then repeats
    the last; `played` is set once the script is through."""

    def __init__(self, replies: list[pb.GetServerInfoResponse | Exception]) -> None:
        self.replies = replies
        self.calls = 0
        self.played = asyncio.Event()

    async def GetServerInfo(self, request: pb.GetServerInfoRequest,
                            timeout: float) -> pb.GetServerInfoResponse:
        reply = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        if self.calls >= len(self.replies):
            self.played.set()
        if isinstance(reply, Exception):
            raise reply
        return reply


def _watch(replies: list[pb.GetServerInfoResponse | Exception]) -> ServerWatch:
    async def go() -> ServerWatch:
        stub = ScriptedStub(replies)
        async with ServerWatch(stub, interval_s=0.001) as watch:  # type: ignore[arg-type]
            await stub.played.wait()
        return watch

    return asyncio.run(go())


def test_replica_load_is_routed_peaks_and_share_within_the_level() -> None:
    a, b = "unix:/tmp/r0.sock", "unix:/tmp/r1.sock"
    first = pb.GetServerInfoResponse(routing="cache_aware", replicas=[
        _replica(a, routed=10, cached=0, prompt=500), _replica(b, routed=4, prompt=200)])
    busy = pb.GetServerInfoResponse(routing="cache_aware", replicas=[
        _replica(a, running=7, waiting=2, routed=16), _replica(b, running=3, waiting=5, routed=9)])
    calmer = pb.GetServerInfoResponse(routing="cache_aware", replicas=[
        _replica(a, running=4, routed=20), _replica(b, running=6, routed=12)])
    error = grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(),
                                 grpc.aio.Metadata(), "slow")
    last = pb.GetServerInfoResponse(routing="cache_aware", replicas=[
        _replica(a, routed=20, cached=300, prompt=900),
        _replica(b, state=DOWN, routed=12, cached=0, prompt=400)])
    watch = _watch([first, busy, error, calmer, last])
    assert watch.failed_polls == 1  # a failed poll is skipped, the level goes on
    assert watch.last.routing == "cache_aware"
    assert watch.replicas() == [
        ReplicaLoad(a, "serving", routed_requests=10, peak_running=7, peak_waiting=2,
                    cached_share=300 / 400),
        ReplicaLoad(b, "unavailable", routed_requests=8, peak_running=6, peak_waiting=5,
                    cached_share=0.0)]
    table = replica_table(watch.replicas())
    assert a in table and "unavailable" in table and "0.750" in table


def test_a_server_without_replicas_gets_no_replica_rows() -> None:
    before = pb.GetServerInfoResponse(cached_tokens_total=5, prompt_tokens_total=10)
    after = pb.GetServerInfoResponse(cached_tokens_total=35, prompt_tokens_total=70)
    watch = _watch([before, after])
    assert watch.replicas() == [] and watch.cached_share == 0.5
    level = _level(replicas=[])
    assert serving.format_report([level]) == serving.format_table([level])
    with_replicas = _level(replicas=[ReplicaLoad("r0", "serving", 3, 2, 1, 0.5)])
    report = serving.format_report([with_replicas])
    assert report.startswith(serving.format_table([with_replicas]))
    assert "routing round_robin" in report and "r0" in report


def _level(replicas: list[ReplicaLoad]) -> serving.LevelResult:
    ms = {"mean": 1.0, "p50": 1.0, "p99": 2.0}
    return serving.LevelResult(
        concurrency=2, request_rate=float("inf"), completed=4, failed=0, duration_s=1.0,
        output_tok_s=16.0, request_s=4.0, ttft_ms=ms, tpot_ms=ms, itl_ms=ms, e2e_ms=ms,
        goodput_s=4.0, cached_share=0.5, server_cached_share=0.5,
        routing="round_robin" if replicas else "", replicas=replicas)
