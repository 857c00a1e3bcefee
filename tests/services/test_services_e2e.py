"""End to end through the real four-process stack (`radixserve serve --model demo`)."""

from __future__ import annotations

import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from radixserve.client import Client, Finished, Started
from radixserve.v1 import generate_pb2 as pb
from svc_helpers import Stack, collect, health_status, request, wait_idle

PROMPTS = ["Hello world", "The quick brown fox", "Once upon a time, in a land"]


@pytest.fixture(scope="module")
def offline(demo_path: str):
    from radixserve.engine import LLM

    return LLM(demo_path, device="cpu", dtype="float32")


def test_greedy_stream_equals_offline_engine(stack: Stack, offline) -> None:
    from radixserve.engine import SamplingParams

    expected = offline.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12))
    offline.core.check_integrity()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(
            lambda p: collect(stack.stub, request(p, max_new_tokens=12, temperature=0.0)), PROMPTS))
    for want, got in zip(expected, results):
        assert got.code == grpc.StatusCode.OK, got.details
        assert got.token_ids == want.token_ids
        assert got.text == want.text
        assert got.finished.usage.completion_tokens == len(want.token_ids)


def test_temperature_zero_is_top_k_one_and_unset_is_sampling(stack: Stack) -> None:
    ids = list(range(10, 40))
    greedy = collect(stack.stub, request(ids, max_new_tokens=10, temperature=0.0, ignore_eos=True))
    top1 = collect(stack.stub, request(ids, max_new_tokens=10, top_k=1, ignore_eos=True))
    assert greedy.token_ids == top1.token_ids and len(greedy.token_ids) == 10
    # Unset temperature is the documented default 1.0: seeded sampling, not greedy.
    sampled = [collect(stack.stub,
                       request(ids, max_new_tokens=10, seed=s, ignore_eos=True)).token_ids
               for s in (1, 2, 3)]
    assert any(s != greedy.token_ids for s in sampled)
    again = collect(stack.stub, request(ids, max_new_tokens=10, seed=2, ignore_eos=True))
    assert again.token_ids == sampled[1]


def test_n_completions_equal_single_requests_with_seed_plus_index(stack: Stack) -> None:
    """n completions of one prompt through the real engine (admitted as one group, prefilling the
    same prompt side by side): completion i is what a lone request with seed + i makes."""
    ids = list(range(50, 90))
    res = collect(stack.stub, request(ids, max_new_tokens=12, seed=11, n=3, ignore_eos=True))
    assert res.code == grpc.StatusCode.OK, res.details
    by_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for r in res.responses:
        if r.HasField("delta"):
            by_index[r.index] += r.delta.token_ids
    assert sorted(r.index for r in res.responses if r.HasField("finished")) == [0, 1, 2]
    alone = [collect(stack.stub,
                     request(ids, max_new_tokens=12, seed=11 + i, ignore_eos=True)).token_ids
             for i in range(3)]
    assert [by_index[i] for i in range(3)] == alone
    assert len({tuple(t) for t in alone}) > 1, "seeded completions should differ"
    wait_idle(stack.stub)


def test_64_concurrent_streams_complete(stack: Stack) -> None:
    def one(i: int):
        return collect(stack.stub, request([3 + i, 50 + i, 7], max_new_tokens=6, ignore_eos=True,
                                           temperature=0.0, request_id=f"c{i}"))

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    for i, res in enumerate(results):
        assert res.code == grpc.StatusCode.OK, res.details
        assert len(res.token_ids) == 6
        assert res.finished.finish_reason == pb.FINISH_REASON_LENGTH
        assert {r.request_id for r in res.responses} == {f"c{i}"}


def test_cancel_half_mid_stream_returns_pool_to_free(stack: Stack) -> None:
    """Half the streams are cancelled mid-decode; the others return their exact token count."""
    outcome: dict[int, object] = {}

    def one(i: int) -> None:
        call = stack.stub.Generate(request([9, i + 1, 4], max_new_tokens=12 if i % 2 else 400,
                                           ignore_eos=True, temperature=0.0 if i % 4 else 0.7))
        tokens = 0
        try:
            for response in call:
                tokens += len(response.delta.token_ids)
                if i % 2 == 0 and tokens >= 2 + i // 2:
                    call.cancel()
        except grpc.RpcError as exc:
            outcome[i] = exc.code()
            return
        outcome[i] = tokens

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert {outcome[i] for i in range(0, 32, 2)} == {grpc.StatusCode.CANCELLED}
    assert {outcome[i] for i in range(1, 32, 2)} == {12}
    info = wait_idle(stack.stub)  # running 0, free + evictable == total, no per-request state
    assert info.kv_pages_free + info.kv_pages_evictable == info.kv_pages_total


def test_cancel_storm_while_normal_streams_run(stack: Stack) -> None:
    """A small Rapid-Reset shape: many streams opened and reset at once beside normal ones."""
    normal: list[int] = []

    def steady(i: int) -> None:
        normal.append(len(collect(stack.stub, request([11, i], max_new_tokens=10,
                                                      ignore_eos=True)).token_ids))

    threads = [threading.Thread(target=steady, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for i in range(300):
        call = stack.stub.Generate(request([13, i % 500 + 1], max_new_tokens=50, ignore_eos=True))
        if i % 3:
            next(call, None)  # some get as far as Started
        call.cancel()
    for t in threads:
        t.join(120)
    assert normal == [10] * 8
    wait_idle(stack.stub)


def test_stop_string_and_stop_token(stack: Stack) -> None:
    base = collect(stack.stub, request("Hello world", max_new_tokens=16, temperature=0.0,
                                       ignore_eos=True))
    stop = base.text[6:9]
    assert stop.strip(), base.text
    res = collect(stack.stub, request("Hello world", max_new_tokens=16, temperature=0.0,
                                      ignore_eos=True, stop=[stop]))
    assert res.finished.finish_reason == pb.FINISH_REASON_STOP_STRING
    assert res.finished.stop_string == stop
    assert res.text == base.text[: base.text.index(stop)]
    token = base.token_ids[3]
    res = collect(stack.stub, request("Hello world", max_new_tokens=16, temperature=0.0,
                                      ignore_eos=True, stop_token_ids=[token]))
    assert res.finished.finish_reason == pb.FINISH_REASON_STOP_TOKEN
    assert res.finished.stop_token_id == token
    assert res.token_ids == base.token_ids[: base.token_ids.index(token) + 1]


def test_chat_logprobs_and_prompt_echo(stack: Stack) -> None:
    res = collect(stack.stub, request([("user", "hi there")], max_new_tokens=3, temperature=0.0,
                                      top_logprobs=3, logprobs=True, return_prompt_info=True))
    assert res.code == grpc.StatusCode.OK, res.details
    started = res.responses[0].started
    tokenized = stack.stub.Tokenize(pb.TokenizeRequest(chat=pb.ChatMessages(
        messages=[pb.ChatMessage(role="user", content="hi there")])))
    assert list(started.prompt_token_ids) == list(tokenized.token_ids)
    deltas = [r.delta for r in res.responses if r.HasField("delta")]
    for d in deltas:
        assert len(d.logprobs) == len(d.token_ids)
        assert len(d.logprobs[0].top) == 3
        assert d.logprobs[0].top[0].token_id == d.token_ids[0]  # greedy picks the top-1


def test_tokenize_detokenize_model_info(stack: Stack) -> None:
    info = stack.stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.vocab_size == 1024 and info.max_context == 4096 and info.has_chat_template
    ids = stack.stub.Tokenize(pb.TokenizeRequest(text="Hello world")).token_ids
    assert ids
    text = stack.stub.Detokenize(pb.DetokenizeRequest(token_ids=ids)).text
    assert text == "Hello world"


def test_deadline_in_decode_stops_engine_work(stack: Stack) -> None:
    res = collect(stack.stub, request([5, 6], max_new_tokens=2000, ignore_eos=True), timeout=1.0)
    assert res.code == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_idle(stack.stub, timeout=5)  # aborted, not run to 2000 tokens


def test_health_reflection_and_metrics(stack: Stack) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health_status(stack.target) == serving
    assert health_status(stack.target, "radixserve.v1.GenerateService") == serving
    refl = reflection_pb2_grpc.ServerReflectionStub(stack.channel)
    reply = next(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
        list_services="")])))
    names = {s.name for s in reply.list_services_response.service}
    assert {"radixserve.v1.GenerateService", "grpc.health.v1.Health"} <= names
    collect(stack.stub, request("metrics", max_new_tokens=2))
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics").read().decode()
    assert 'radixserve_requests_total{code="OK",method="Generate"}' in text
    assert "radixserve_time_to_first_token_seconds_bucket" in text
    assert "radixserve_e2e_request_latency_seconds_count" in text
    sched = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port + 1}/metrics").read()
    assert b"radixserve_kv_page_usage" in sched and b"radixserve_prefix_cache_hit_rate" in sched


def test_prefix_cache_hits_are_reported(stack: Stack) -> None:
    prompt = list(range(100, 180))
    first = collect(stack.stub, request(prompt, max_new_tokens=2, temperature=0.0))
    second = collect(stack.stub, request(prompt, max_new_tokens=2, temperature=0.0))
    assert second.finished.usage.cached_tokens >= 64 > first.finished.usage.cached_tokens
    assert stack.stub.GetServerInfo(pb.GetServerInfoRequest()).prefix_cache_hit_rate > 0


def test_bench_serving_smoke(stack: Stack) -> None:
    import asyncio

    from radixserve.bench import plane_timing
    from radixserve.bench import serving as bench_serving

    cfg = bench_serving.BenchConfig(stack.target, (1, 3), num_prompts=6, input_len=16,
                                    output_len=4, range_ratio=0.5, request_rate=50.0,
                                    temperature=0.0, seed=0)
    results = asyncio.run(bench_serving.run(cfg))
    assert [r.completed for r in results] == [6, 6] and not any(r.failed for r in results)
    assert all(r.output_tok_s > 0 and r.ttft_ms["p50"] > 0 for r in results)
    assert "TTFT p50" in bench_serving.format_table(results)
    # Online load: after the burst levels, Poisson arrivals at fractions of the best rate; an SLO
    # nobody can meet leaves no goodput, an unbounded one counts every completed request.
    cfg = bench_serving.BenchConfig(stack.target, (3,), num_prompts=6, input_len=16, output_len=4,
                                    range_ratio=0.5, request_rate=float("inf"), temperature=0.0,
                                    seed=0, rate_fractions=(0.5,), slo_ttft_ms=0.0)
    burst, online = asyncio.run(bench_serving.run(cfg))
    assert online.request_rate == 0.5 * burst.request_s and online.completed == 6
    assert burst.goodput_s == online.goodput_s == 0.0
    assert results[0].goodput_s == results[0].request_s
    # n = 2: every completion's tokens are counted (6 requests x 2 completions x 4 tokens); sent
    # by two client processes over two connections each.
    cfg = bench_serving.BenchConfig(stack.target, (3,), num_prompts=6, input_len=16, output_len=4,
                                    range_ratio=0.0, request_rate=50.0, temperature=1.0, seed=0,
                                    n=2, channels=4, processes=2)
    (two,) = asyncio.run(bench_serving.run(cfg))
    assert two.completed == 6 and round(two.output_tok_s * two.duration_s) == 48
    assert two.itl_ms["p50"] > 0
    # the client's CPU counts both workers' (a worker runs its own loop and channels)
    assert two.client_cores > 0 and results[0].client_cores > 0
    # The plane's timing from the gateway's and the scheduler's metrics around the level: every
    # step and message of its 6 x 4 tokens counted once (the first tokens' steps included).
    urls = [f"http://127.0.0.1:{stack.metrics_port + i}/metrics" for i in (0, 1)]
    cfg = bench_serving.BenchConfig(stack.target, (3,), num_prompts=6, input_len=16, output_len=4,
                                    range_ratio=0.0, request_rate=float("inf"), temperature=0.0,
                                    seed=1)
    (timed,) = asyncio.run(bench_serving.run(cfg, bench_serving.Probes(metrics=urls)))
    plane = timed.plane
    assert 0 < plane["step_ms"] < timed.duration_s * 1e3
    assert 6 <= plane["handoff_ms"]["count"] <= 24  # a message carries one token or several
    assert 4 <= plane["arrival_ms"]["count"] <= plane["handoff_ms"]["count"]
    assert 0 <= plane["handoff_ms"]["mean"] < timed.duration_s * 1e3
    assert "TPOT p50/step" in plane_timing.format_plane([timed])
    # the streams' gaps as the gateway handed them out: one fewer than each stream's messages
    handed = plane["handed_itl_ms"]
    assert handed["count"] == plane["handoff_ms"]["count"] - 6 and handed["p50"] > 0, handed
    assert "gateways handed" in plane_timing.format_streams([timed])
    # the engine's steps that decoded (each request decodes its last 3 tokens), none outside the
    # level's steps, and each as long as the engine measured it
    steps = round(timed.duration_s * 1e3 / plane["step_ms"])
    decoded = plane["decode_step_ms"]["count"] + plane["mixed_step_ms"]["count"]
    assert 3 <= decoded <= steps, (plane, steps)
    assert 0 < plane["decode_step_ms"]["p50"] <= plane["decode_step_ms"]["p99"], plane
    assert "decode share/p50/p99" in plane_timing.format_plane([timed])
    # the mixed steps again, by their prefill: every one of them in one class
    by_prefill = plane["mixed_by_prefill_ms"]
    assert sum(q["count"] for q in by_prefill.values()) == plane["mixed_step_ms"]["count"]
    # the engine thread's phases: a launch and a read for each of those steps, the level's own
    host = plane["host_ms"]
    assert decoded <= host["launch"]["count"] <= steps + 1 and host["wait"]["count"] >= decoded
    assert "launch mean/p50/p99" in plane_timing.format_host([timed])
    # every forward of the level, counted by how it ran: eagerly, on a CPU
    forwards = plane["forwards"]
    assert set(forwards) == {"decode_graph", "whole_graph", "pieces", "eager"}, forwards
    assert decoded <= forwards["eager"] == sum(forwards.values()), forwards
    assert "whole_graph" in plane_timing.format_forwards([timed])
    # the engine thread's CPU time (at most one core) beside its wall time outside the wait
    assert 0 < plane["engine_cpu_cores"] <= 1.0 and plane["engine_busy_cores"] > 0, plane
    # the garbage collector's pauses, read from the scheduler and the gateway apart (a level
    # this short may make too little garbage for a collection)
    assert plane["scheduler_gc"]["ms_per_s"] >= 0 and len(plane["gateway_gc"]["count"]) == 3
    assert plane["prefill_cap"] == [0.0]  # one replica; on the CPU, steps with prefill are eager


def test_internal_services_are_private_and_need_the_secret(stack: Stack) -> None:
    import os
    import stat

    from radixserve.internal.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
    from svc_helpers import cmdline

    argv = cmdline(stack.child("scheduler")).split()
    address = argv[argv.index("--address") + 1]
    assert address.startswith("unix:")
    folder = os.path.dirname(address.removeprefix("unix:"))
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_bench_soak_smoke(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from radixserve.bench import soak as bench_soak
    from radixserve.bench.process import SERVICES

    # 3 connections, as 1000 clients get 4
    monkeypatch.setattr(bench_soak, "STREAMS_PER_CHANNEL", 8)
    cfg = bench_soak.SoakConfig(stack.target, clients=20, duration_s=12.0, cancel_share=0.3,
                                invalid_share=0.05, input_len=(4, 64), output_len=(2, 16), seed=1,
                                rss_every_s=1.0, warmup_s=2.0, max_rss_growth_pct=1e9)
    result = asyncio.run(bench_soak.run(cfg, serve_pid=stack.proc.pid))
    table = bench_soak.format_table(cfg, result)
    assert result.passed, table
    assert result.exact > 0 and result.statuses.get("cancel CANCELLED", 0) > 0, table
    assert result.statuses.get("invalid INVALID_ARGUMENT", 0) > 0, table
    assert set(result.processes) == set(SERVICES), table
    assert all(p["rss_after_mib"] > 0 for p in result.processes.values())
    # every service sampled through the load, a growth fitted to the samples after the warm-up
    assert set(result.rss_growth) == set(SERVICES), table
    assert all(g["samples"] >= 5 and g["rss_min_mib"] > 0 for g in result.rss_growth.values())
    # the samples behind each fit, and the queue beside them, for a reader of the JSON
    assert all(len(result.rss_series[name]) >= g["samples"]
               for name, g in result.rss_growth.items())
    assert sum(n for _, n, _ in result.ttft_series) == result.exact, result.ttft_series
    assert "growth (%/h)" in table and not result.too_fast


def test_bench_abort_smoke(stack: Stack) -> None:
    """`bench abort` reads cancel -> freed from the scheduler's metrics (engine_steps_total), here
    with a reader process holding the streams it does not cancel."""
    from radixserve.bench import abort as bench_abort

    url = f"http://127.0.0.1:{stack.metrics_port + 1}/metrics"
    gateway = f"http://127.0.0.1:{stack.metrics_port}/metrics"
    result = bench_abort.measure(stack.target, url, running=8, cancels=4, output_len=3000,
                                 processes=2, gateway_urls=(gateway,))
    table = bench_abort.format_table(result)
    assert result["processes"] == 2 and "by 2 client process(es)" in table
    # each cancel leaves the client before its request is freed
    assert 0 <= result["client_lag_ms"]["p99"] <= result["ms"]["p99"], table
    assert result["ms"]["p50"] > 0 and result["step_ms"] > 0, table
    assert 0 <= result["steps"]["p50"] <= result["steps"]["max"], table
    assert "| engine steps |" in table
    # each abort timed in the gateway (to its write) and in the scheduler (to the free)
    hops = result["hops"]
    assert hops["gateway_ms"]["count"] == hops["scheduler_ms"]["count"] == 4, hops
    assert "from the abort's receipt to the free" in table
    # every cancel is kept in order, with the channel that carried it
    assert [e["channel"] for e in result["each"]] == [0, 0, 0, 0], result["each"]
    assert max(e["steps"] for e in result["each"]) == result["steps"]["max"]
    assert "over 2 steps" in table


def test_two_gateways_share_the_public_port(tmp_path) -> None:
    """`serve --gateways 2`: both gateway processes listen on the one port, the kernel spreads
    client connections over them, and each serves the calls that reach it."""
    import time

    from radixserve.v1 import generate_pb2_grpc as pb_grpc

    ready_file = tmp_path / "ready"
    s = Stack("--gateways", "2", "--ready-file", str(ready_file), log_path=tmp_path / "serve.log")
    try:
        s.wait_ready()
        deadline = time.monotonic() + 240  # every child ready, the second gateway too
        while not ready_file.exists():
            assert s.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert ready_file.read_text().strip() == s.target
        assert len(s.gateway_pids()) == 2
        routed = []
        for i in range(16):
            # A channel of its own is a connection of its own, which either gateway may accept.
            with grpc.insecure_channel(s.target,
                                       options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                stub = pb_grpc.GenerateServiceStub(ch)
                assert collect(stub, request([7, i], max_new_tokens=2)).code == grpc.StatusCode.OK
                info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
                routed.append(info.replicas[0].routed_requests)  # counted by that gateway
        # One gateway alone would have counted 1, 2, ..., 16; two split the count between them.
        assert max(routed) < 16, routed
        # The client's own connections reach both: the gateway behind its first one holds only
        # some of its 16 streams, and abort() (asked on every connection) ends all of them.
        with Client(s.target, connections=16) as c:
            ids = [f"spread-{i}" for i in range(16)]
            streams = [c.generate(token_ids=[7, i], max_new_tokens=3000, ignore_eos=True,
                                  request_id=rid) for i, rid in enumerate(ids)]
            for stream in streams:
                assert isinstance(next(stream), Started)
            assert 0 < c.server_info().gateway_live_requests < 16
            assert c.abort(ids) == 16
            for stream in streams:
                last = list(stream)[-1]
                assert isinstance(last, Finished) and last.finish_reason == "aborted"
    finally:
        s.stop()
    assert not ready_file.exists()  # serve removes it when it stops


def test_bench_overload_spreads_calls_over_connections(stack: Stack) -> None:
    """`bench overload --channels 2`: both phases run over two connections, every call gets a
    status the target allows (a server with spare slots admits them all), and the table names
    the connections."""
    import asyncio

    from radixserve.bench import overload

    cfg = overload.OverloadConfig(stack.target, max_running=2, max_queued=2, factor=2.0,
                                  duration_s=0.5, input_len=8, output_len=4, channels=2)
    result = asyncio.run(overload.run(cfg))
    assert result["saturating_req_s"] > 0 and result["unloaded"]["codes"] == {"OK": 6}
    codes = result["overload"]["codes"]
    assert sum(codes.values()) >= 1 and set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert 6 <= len(result["unloaded"]["itl"]) <= 6 * 3  # up to 3 gaps in each call's 4 tokens
    assert "2 connection(s)" in overload.format_table(cfg, result)
