"""Data parallelism through the gateway, in process: two scheduler replicas (fake engines, each
with its own detokenizer) behind one gateway. Routing by cached prefix and by turn, a replica's
loss ending only its own streams, its return in place, GetServerInfo per replica, n > 1 and Abort
reaching the replica that holds the request, and a replica serving another model left unused."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
from radixserve.services.gateway.routing import RoutingConfig
from radixserve.v1 import generate_pb2 as pb
from svc_helpers import FakeEngine, InProcess, acollect, idle, request, run_in_process, until

OK, UNAVAILABLE = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE


def _owner(stack: InProcess, prompt: list[int]) -> set[int]:
    """The replicas whose engine was given `prompt`."""
    return {i for i, r in enumerate(stack.replicas) if prompt in r.engine.prompts.values()}


def test_cache_aware_keeps_each_prefix_on_one_replica_and_spreads_prefixes(
        demo_path: str) -> None:
    groups = [[100 + g] * 64 for g in range(4)]

    async def body(stack: InProcess, stub: Any) -> None:
        for k in range(3):
            for g, prefix in enumerate(groups):
                res = await acollect(stub, request([*prefix, 500 + 10 * g + k], max_new_tokens=2))
                assert res.code == OK, res
        owners = [set().union(*(_owner(stack, [*p, 500 + 10 * g + k]) for k in range(3)))
                  for g, p in enumerate(groups)]
        assert all(len(o) == 1 for o in owners), owners  # a group's requests share a replica
        assert set().union(*owners) == {0, 1}  # and the groups are spread over both
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, engines=[FakeEngine(), FakeEngine()])


def test_round_robin_alternates_and_server_info_reports_each_replica(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        for _ in range(4):
            assert (await acollect(stub, request([7] * 32, max_new_tokens=2))).code == OK
        assert [len(r.engine.added) for r in stack.replicas] == [2, 2]
        await until(lambda: idle(stack))
        info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        assert info.routing == "round_robin"
        assert [r.address for r in info.replicas] == [r.address for r in stack.replicas]
        assert [r.state for r in info.replicas] == [pb.REPLICA_STATE_SERVING] * 2
        assert [r.routed_requests for r in info.replicas] == [2, 2]
        assert [r.in_flight_requests for r in info.replicas] == [0, 0]
        # Totals are the replicas' sums (the fake engine reports 64 pages each).
        assert info.kv_pages_total == sum(r.kv_pages_total for r in info.replicas) == 128

    run_in_process(demo_path, body, engines=[FakeEngine(), FakeEngine()],
                   routing=RoutingConfig("round_robin"))


def test_lost_replica_fails_only_its_streams_and_returns_in_place(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        from radixserve.services.scheduler import server as sched_server
        from radixserve.services.scheduler.loop import LoopConfig

        calls = [asyncio.create_task(acollect(stub, request([9, i], max_new_tokens=60)))
                 for i in range(4)]
        await until(lambda: all(len(r.engine.reqs) == 2 for r in stack.replicas))
        lost = stack.replicas[1]
        lost_at = time.monotonic()
        await lost.server.stop(0)
        lost.app.loop.stop(5)
        results = await asyncio.gather(*calls)
        on_lost = [res for i, res in enumerate(results) if _owner(stack, [9, i]) == {1}]
        assert [res.code for res in on_lost] == [UNAVAILABLE] * 2
        assert all(res.code == OK for res in results if res not in on_lost)
        assert time.monotonic() - lost_at < 5.0
        # New calls go to the replica left; GetServerInfo says which one is down.
        assert (await acollect(stub, request([11], max_new_tokens=2))).code == OK
        info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        assert [r.state for r in info.replicas] == [pb.REPLICA_STATE_SERVING,
                                                    pb.REPLICA_STATE_UNAVAILABLE]
        # A scheduler started again on the same address rejoins and gets work again.
        engine = FakeEngine()
        app = sched_server.SchedulerApp(lambda: engine, lost.detokenizer_address,
                                        LoopConfig(warmup=False, idle_poll_s=0.05))
        served = await sched_server.create_server(lost.address, app)
        await served.server.start()
        stack.servers.append(served.server)
        try:
            await until(lambda: all(r.routable for r in stack.gateway.links.replicas), 10)
            for i in range(4):
                assert (await acollect(stub, request([13, i], max_new_tokens=2))).code == OK
            assert engine.added, "the returned replica got no work"
        finally:
            app.loop.stop(5)

    run_in_process(demo_path, body, engines=[FakeEngine(step_delay_s=0.02),
                                             FakeEngine(step_delay_s=0.02)],
                   routing=RoutingConfig("round_robin"))


def test_n_completions_and_abort_reach_the_replica_holding_them(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        assert (await acollect(stub, request([3], max_new_tokens=2))).code == OK
        (first,) = _owner(stack, [3])
        other = stack.replicas[1 - first].engine  # round robin: the next call goes there
        call = asyncio.create_task(
            acollect(stub, request([4], max_new_tokens=4000, n=3, request_id="three")))
        await until(lambda: len(other.reqs) == 3)
        assert not stack.replicas[first].engine.reqs  # the group went whole to one replica
        reply = await stub.Abort(pb.AbortRequest(request_ids=["three"]), timeout=5)
        assert reply.aborted == 1
        await until(lambda: len(other.aborted) == 3)
        res = await call
        assert res.code == OK
        assert {r.finished.finish_reason for r in res.responses if r.HasField("finished")} == {
            pb.FINISH_REASON_ABORTED}
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, engines=[FakeEngine(step_delay_s=0.01),
                                             FakeEngine(step_delay_s=0.01)],
                   routing=RoutingConfig("round_robin"))


def test_replica_serving_another_model_is_not_used(demo_path: str) -> None:
    """The first replica to answer sets the model; one that differs gets no work."""
    async def body(stack: InProcess, stub: Any) -> None:
        await until(lambda: stack.gateway.links.model_info is not None)
        await asyncio.sleep(1.0)  # several reconnect rounds for the odd one out
        for i in range(3):
            assert (await acollect(stub, request([5, i], max_new_tokens=2))).code == OK
        used = [i for i, r in enumerate(stack.replicas) if r.engine.added]
        assert len(used) == 1
        info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        states = [pb.REPLICA_STATE_UNAVAILABLE] * 2
        states[used[0]] = pb.REPLICA_STATE_SERVING
        assert [r.state for r in info.replicas] == states

    run_in_process(demo_path, body, engines=[FakeEngine(), FakeEngine(vocab_size=2048)],
                   routing=RoutingConfig("round_robin"))


def test_gateways_sharing_replicas_each_get_only_their_own_deltas(demo_path: str) -> None:
    """Two gateways in front of the same replicas: each names itself to the detokenizers, which
    send it only its requests' deltas (the other gateway's tokens are not its work)."""
    async def body(stack: InProcess, stub: Any) -> None:
        from radixserve.services.gateway import server as gw_server
        from radixserve.services.gateway.frontend import FrontendConfig
        from radixserve.v1 import generate_pb2_grpc as pb_grpc

        backends = gw_server.BackendAddresses(
            f"127.0.0.1:{stack.ports['tokenizer']}", [r.address for r in stack.replicas],
            [r.detokenizer_address for r in stack.replicas])
        other = await gw_server.create_server("127.0.0.1:0", backends, FrontendConfig())
        await other.server.start()
        stack.servers.append(other.server)
        seen: dict[str, set[str]] = {"first": set(), "other": set()}
        for name, gateway in (("first", stack.gateway), ("other", other.gateway)):
            frontend = gateway.frontend
            gateway.links.events = _Recording(frontend, seen[name])
        await until(lambda: other.gateway.links.ready
                    and all(r.routable for r in other.gateway.links.replicas))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{other.port}") as channel:
            other_stub = pb_grpc.GenerateServiceStub(channel)
            for i in range(4):
                for s in (stub, other_stub):
                    assert (await acollect(s, request([21, i], max_new_tokens=3))).code == OK
        assert len(seen["first"]) == len(seen["other"]) == 4
        assert not seen["first"] & seen["other"]  # no delta reached the other gateway
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, engines=[FakeEngine(), FakeEngine()])


class _Recording:
    """A frontend's events, with the ids of the deltas it is given recorded."""

    def __init__(self, frontend: Any, rids: set[str]) -> None:
        self._frontend = frontend
        self._rids = rids

    def __getattr__(self, name: str) -> Any:
        return getattr(self._frontend, name)

    def on_output(self, output: Any) -> None:
        self._rids.add(output.rid)
        self._frontend.on_output(output)
