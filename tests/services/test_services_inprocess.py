"""In-process gRPC tests (port 0): all four servers in one event loop over a fake engine, so
request lifecycles are checked quickly and precisely (which ids the engine saw aborted, when)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc
from svc_helpers import (
    FakeEngine,
    InProcess,
    acollect,
    idle,
    request,
    run_in_process,
    start_in_process,
    until,
)


def test_stream_ids_usage_and_request_id(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        res = await acollect(stub, request([5, 6, 7], max_new_tokens=4, request_id="mine"))
        assert res.code == grpc.StatusCode.OK
        assert res.token_ids == [8, 9, 10, 11]
        assert {r.request_id for r in res.responses} == {"mine"}
        assert res.responses[0].started.prompt_tokens == 3
        assert res.finished.finish_reason == pb.FINISH_REASON_LENGTH
        assert res.finished.usage.completion_tokens == 4
        # The internal id is not the client's: ids are fresh per call, so "mine" is free again.
        assert "mine" not in stack.engine.added
        again = await acollect(stub, request([5], max_new_tokens=1, request_id="mine"))
        assert again.code == grpc.StatusCode.OK
        await until(lambda: idle(stack))

    run_in_process(demo_path, body)


@pytest.mark.parametrize("n", [1, 4])
def test_client_cancel_aborts_in_engine_and_frees_every_map(demo_path: str, n: int) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        call = stub.Generate(request([5], max_new_tokens=200, request_id="c", n=n))
        async for response in call:
            if response.HasField("delta"):
                break
        cancelled_at = stack.engine.steps
        call.cancel()
        await until(lambda: len(stack.engine.aborted) == n)
        assert set(stack.engine.aborted) == set(stack.engine.added)  # every completion
        # Each abort reaches the engine within two scheduler steps of the client's RST
        # (docs/reliability.md #11).
        assert all(stack.engine.abort_steps[rid] - cancelled_at <= 2
                   for rid in stack.engine.aborted)
        # The gateway timed each completion's abort to its write on the Submit stream.
        registry = stack.gateway.metrics.registry

        def sent(suffix: str) -> float:
            return registry.get_sample_value(f"radixserve_abort_sent_seconds_{suffix}") or 0.0

        await until(lambda: sent("count") == n)
        assert 0 <= sent("sum") < 5.0
        await until(lambda: idle(stack))
        # The id is reusable at once.
        res = await acollect(stub, request([5], max_new_tokens=2, request_id="c"))
        assert res.code == grpc.StatusCode.OK and len(res.token_ids) == 2

    run_in_process(demo_path, body, step_delay_s=0.01)


def test_gateway_times_each_step_from_the_scheduler_to_the_streams(demo_path: str) -> None:
    """The step time the scheduler stamps reaches the gateway through the detokenizer, which adds
    its own: one reading of each point per step (one hand-off per message), the detokenizer's
    before the arrival on average, and each shorter than the whole call took; the gaps between
    the stream's messages are timed too."""
    async def body(stack: InProcess, stub: Any) -> None:
        start = time.monotonic()
        res = await acollect(stub, request([5], max_new_tokens=6))
        took = time.monotonic() - start
        assert res.code == grpc.StatusCode.OK and len(res.token_ids) == 6
        registry = stack.gateway.metrics.registry

        def sample(name: str, suffix: str) -> float:
            return registry.get_sample_value(f"radixserve_{name}_delay_seconds_{suffix}") or 0.0

        assert sample("token_handoff", "count") >= 1  # messages may join tokens
        points = ("step_detokenizer_received", "step_detokenized", "step_arrival")
        steps = sample("step_arrival", "count")
        assert steps >= sample("token_handoff", "count")
        assert [sample(name, "count") for name in points] == [steps] * 3
        means = [sample(name, "sum") / sample(name, "count") for name in (*points, "token_handoff")]
        assert means[:3] == sorted(means[:3]) and 0 <= min(means) and max(means) <= took
        # the stream's inter-token gaps as handed to gRPC: one per message after its first, and
        # together the span from its first tokens to its last, within the call
        gaps = [registry.get_sample_value(f"radixserve_inter_token_latency_seconds_{suffix}")
                for suffix in ("count", "sum")]
        assert gaps[0] == sample("token_handoff", "count") - 1
        assert (gaps[1] > 0) == (gaps[0] > 0) and gaps[1] < took

    run_in_process(demo_path, body, step_delay_s=0.01)


def test_deadline_aborts_in_engine(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        res = await acollect(stub, request([5], max_new_tokens=10_000 // 100), timeout=0.3)
        assert res.code == grpc.StatusCode.DEADLINE_EXCEEDED
        await until(lambda: len(stack.engine.aborted) == 1)
        await until(lambda: idle(stack))
        registry = stack.gateway.metrics.registry
        labels = {"method": "Generate", "code": "DEADLINE_EXCEEDED"}
        await until(lambda: registry.get_sample_value("radixserve_requests_total", labels) == 1)

    run_in_process(demo_path, body, step_delay_s=0.02)


def test_stop_string_finishes_and_aborts_in_engine(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        full = await acollect(stub, request([300], max_new_tokens=12))
        stop = full.text[len(full.text) // 2:][:3]
        res = await acollect(stub, request([300], max_new_tokens=12, stop=[stop]))
        assert res.finished.finish_reason == pb.FINISH_REASON_STOP_STRING
        assert res.finished.stop_string == stop
        assert res.text == full.text[: full.text.index(stop)]
        await until(lambda: idle(stack))
        assert stack.engine.aborted, "the engine must stop generating after a stop string"

    run_in_process(demo_path, body, step_delay_s=0.01)


def test_public_abort_ends_stream_with_aborted(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        call = stub.Generate(request([5], max_new_tokens=500, request_id="victim"))
        seen: list[pb.GenerateResponse] = []
        async for response in call:
            seen.append(response)
            if response.HasField("delta") and len(seen) == 3:
                reply = await stub.Abort(pb.AbortRequest(request_ids=["victim", "unknown"]))
                assert reply.aborted == 1
        assert seen[-1].finished.finish_reason == pb.FINISH_REASON_ABORTED
        again = await stub.Abort(pb.AbortRequest(request_ids=["victim"]))  # idempotent
        assert again.aborted == 0
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, step_delay_s=0.01)


def test_engine_rejection_is_invalid_argument_before_started(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        res = await acollect(stub, request([5, 99], max_new_tokens=4))
        assert res.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "KV pages" in res.details and res.responses == []
        ok = await acollect(stub, request([5], max_new_tokens=2))
        assert ok.code == grpc.StatusCode.OK
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, reject_token=99)


def test_batched_submission_one_message_per_step(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        results = await asyncio.gather(
            *(acollect(stub, request([i + 10], max_new_tokens=5)) for i in range(32)))
        for i, res in enumerate(results):
            assert res.code == grpc.StatusCode.OK
            assert res.token_ids == [i + 11 + k for k in range(5)]
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, step_delay_s=0.005)


def test_scheduler_loss_fails_streams_unavailable(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        calls = [asyncio.create_task(acollect(stub, request([5], max_new_tokens=1000)))
                 for _ in range(4)]
        await until(lambda: len(stack.engine.reqs) == 4)
        t0 = time.monotonic()
        await stack.servers[1].stop(0)  # the scheduler's gRPC server
        results = await asyncio.gather(*calls)
        assert time.monotonic() - t0 < 5
        assert {r.code for r in results} == {grpc.StatusCode.UNAVAILABLE}
        health = health_pb2_grpc.HealthStub(grpc.aio.insecure_channel(stack.target))
        reply = await health.Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        res = await acollect(stub, request([5], max_new_tokens=1))
        assert res.code == grpc.StatusCode.UNAVAILABLE

    run_in_process(demo_path, body, step_delay_s=0.01)


def test_drain_refuses_new_calls_and_finishes_in_flight(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        running = asyncio.create_task(acollect(stub, request([5], max_new_tokens=30)))
        await until(lambda: len(stack.engine.reqs) == 1)
        drain = asyncio.create_task(stack.gateway.drain())
        await until(lambda: stack.gateway.frontend.draining)
        health = health_pb2_grpc.HealthStub(grpc.aio.insecure_channel(stack.target))
        reply = await health.Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        refused = await acollect(stub, request([5], max_new_tokens=1))
        assert refused.code == grpc.StatusCode.UNAVAILABLE
        done = await running
        assert done.code == grpc.StatusCode.OK and len(done.token_ids) == 30
        await drain

    run_in_process(demo_path, body, step_delay_s=0.01)


@pytest.mark.parametrize("in_flight", [1])
def test_in_flight_cap_is_resource_exhausted(demo_path: str, in_flight: int) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        first = asyncio.create_task(acollect(stub, request([5], max_new_tokens=20)))
        await until(lambda: len(stack.engine.reqs) == 1)
        second = await acollect(stub, request([5], max_new_tokens=1))
        assert second.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await first).code == grpc.StatusCode.OK

    run_in_process(demo_path, body, frontend={"max_in_flight": in_flight}, step_delay_s=0.01)


def test_internal_rpcs_need_the_shared_secret(demo_path: str) -> None:
    from radixserve.internal.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
    from radixserve.internal.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
    from radixserve.services.common.auth import METADATA_KEY

    async def main() -> None:
        stack = await start_in_process(FakeEngine(), demo_path, secret="s3cret")
        try:
            async with grpc.aio.insecure_channel(stack.target) as channel:
                ok = await acollect(pb_grpc.GenerateServiceStub(channel), request([5], 2))
                assert ok.code == grpc.StatusCode.OK  # the gateway carries the secret
            tok_addr = f"127.0.0.1:{stack.ports['tokenizer']}"
            async with grpc.aio.insecure_channel(tok_addr) as channel:
                tok = tokenizer_pb2_grpc.TokenizerServiceStub(channel)
                for metadata in ((), ((METADATA_KEY, "wrong"),), ((METADATA_KEY, "S3CRET"),)):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await tok.GetTokenizerInfo(tokenizer_pb2.GetTokenizerInfoRequest(),
                                                   metadata=metadata)
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                info = await tok.GetTokenizerInfo(tokenizer_pb2.GetTokenizerInfoRequest(),
                                                  metadata=((METADATA_KEY, "s3cret"),))
                assert info.vocab_size > 0
                health = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest())  # probes need no secret
                assert health.status == health_pb2.HealthCheckResponse.SERVING
            sched_addr = f"127.0.0.1:{stack.ports['scheduler']}"
            async with grpc.aio.insecure_channel(sched_addr) as channel:
                call = scheduler_pb2_grpc.SchedulerServiceStub(channel).Submit()
                # The refusal may end the call before the write completes, or after it.
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.write(scheduler_pb2.SubmitRequest(abort_ids=["x"]))
                    await call.read()
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await stack.close()

    asyncio.run(main())


def test_n_completions_stream_tagged_by_index(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        res = await acollect(stub, request([5, 6], max_new_tokens=4, n=3, seed=7, request_id="n3"))
        assert res.code == grpc.StatusCode.OK, res.details
        assert [r.WhichOneof("event") for r in res.responses].count("started") == 1
        assert res.responses[0].HasField("started")
        tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
        finished = {}
        for r in res.responses:
            if r.HasField("delta"):
                assert r.index not in finished, "a Delta after its completion's Finished"
                tokens[r.index] += r.delta.token_ids
            elif r.HasField("finished"):
                finished[r.index] = r.finished
        assert res.responses[-1].HasField("finished")  # the stream ends with the last Finished
        assert sorted(finished) == [0, 1, 2]
        assert all(len(t) == 4 for t in tokens.values())
        assert all(f.usage.completion_tokens == 4 and f.usage.prompt_tokens == 2
                   for f in finished.values())
        # n internal requests, one group; completion i draws with seed + i.
        seeds = sorted(stack.engine.params_seen[rid].seed for rid in stack.engine.added)
        assert seeds == [7, 8, 9]
        await until(lambda: idle(stack))

    run_in_process(demo_path, body)


def test_n_public_abort_finishes_each_completion_aborted(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        call = stub.Generate(request([5], max_new_tokens=500, n=2, request_id="two"))
        responses = []
        async for response in call:
            responses.append(response)
            if response.HasField("delta") and len(responses) == 2:
                assert (await stub.Abort(pb.AbortRequest(request_ids=["two"]))).aborted == 1
        ends = [(r.index, r.finished.finish_reason) for r in responses if r.HasField("finished")]
        assert sorted(ends) == [(0, pb.FINISH_REASON_ABORTED), (1, pb.FINISH_REASON_ABORTED)]
        await until(lambda: len(stack.engine.aborted) == 2)
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, step_delay_s=0.01)
