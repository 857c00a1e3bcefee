"""Structured output through the serving plane: the constraint oneof's conversions, and the
scheduler service's compile path (`services/scheduler/compile.py`) over a fake engine whose
`compile_grammar` sleeps or raises."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
import pytest
from radixserve.bench.grammar import nested_objects
from radixserve.engine.sampling.params import MAX_CONSTRAINT_CHARS, SamplingParams
from radixserve.services.common.errors import ServiceError
from radixserve.services.gateway import convert as gw_convert
from radixserve.services.scheduler import convert as sched_convert
from radixserve.services.scheduler.compile import GrammarCompiler, split
from radixserve.services.scheduler.loop import EngineLoop, LoopConfig
from radixserve.services.scheduler.types import NewRequest
from radixserve.v1 import generate_pb2 as pb
from svc_helpers import (
    FakeEngine,
    InProcess,
    Sink,
    acollect,
    idle,
    request,
    run_in_process,
    until,
)

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"enum": ["x", "y"]}}})

# -- conversions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,text", [("json_schema", SCHEMA), ("regex", "[ab]{1,4}"),
                                       ("ebnf", 'root ::= "yes" | "no"')])
def test_constraint_travels_gateway_to_scheduler(kind: str, text: str) -> None:
    params = gw_convert.params_from_pb(request("hi", **{kind: text}))
    assert params.constraint == (kind, text)
    msg = gw_convert.new_request_to_pb("r", [5], params, True)
    assert msg.sampling.WhichOneof("constraint") == kind
    back = sched_convert.new_request_from_pb(msg)
    assert back.params.constraint == (kind, text)
    assert back.grammar is None  # compiled later, in the scheduler service


def test_unconstrained_request_sets_no_constraint() -> None:
    params = gw_convert.params_from_pb(request("hi"))
    assert params.constraint is None
    msg = gw_convert.new_request_to_pb("r", [5], params, True)
    assert msg.sampling.WhichOneof("constraint") is None
    assert sched_convert.new_request_from_pb(msg).params.constraint is None


@pytest.mark.parametrize("kind,text", [("json_schema", ""), ("regex", "  "),
                                       ("ebnf", "x" * (MAX_CONSTRAINT_CHARS + 1))])
def test_bad_constraint_is_invalid_argument_naming_the_field(kind: str, text: str) -> None:
    with pytest.raises(ServiceError) as err:
        gw_convert.params_from_pb(request("hi", **{kind: text}))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert kind in err.value.message


def test_constraint_of_the_public_oneof_keeps_only_the_last_one_set() -> None:
    req = request("hi", json_schema=SCHEMA)
    req.sampling.regex = "a+"  # a oneof: setting one clears the other
    assert gw_convert.params_from_pb(req).constraint == ("regex", "a+")


# -- the compile path, unit --------------------------------------------------------------------


def _req(rid: str, constraint: str | None = None, group: str = "") -> NewRequest:
    return NewRequest(rid, [5], SamplingParams(max_new_tokens=2, regex=constraint), group=group)


def test_split_keeps_constrained_groups_whole() -> None:
    reqs = [_req("a"), _req("b", "x+"), _req("c0", "y", "c"), _req("c1", "y", "c"),
            _req("d0", None, "d"), _req("d1", None, "d")]
    now, waiting = split(reqs)
    assert [r.rid for r in now] == ["a", "d0", "d1"]
    assert [[r.rid for r in g] for g in waiting] == [["b"], ["c0", "c1"]]


class _Recorder:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.engine = FakeEngine(compile_delay_s=delay_s)
        self.submitted: list[tuple[Any, list[NewRequest]]] = []
        self.rejected: list[tuple[Any, list[Any]]] = []
        self.compiler = GrammarCompiler(self.engine.compile_grammar,
                                        lambda o, r: self.submitted.append((o, r)),
                                        lambda o, r: self.rejected.append((o, r)))


async def _settle(rec: _Recorder, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(rec.compiler):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # done callbacks of dropped jobs


def test_compiler_holds_a_group_until_compiled_then_submits_it_whole_once() -> None:
    async def main() -> None:
        rec = _Recorder(delay_s=0.2)
        group = [_req(f"g{i}", "a{1,3}", "g") for i in range(3)]
        rec.compiler.start("gw", group)
        await asyncio.sleep(0.1)
        assert rec.submitted == [] and len(rec.compiler) == 3  # waiting for the grammar
        await _settle(rec)
        assert rec.engine.compiled == [("regex", "a{1,3}")]  # once for the group
        [(owner, reqs)] = rec.submitted
        assert owner == "gw" and [r.rid for r in reqs] == ["g0", "g1", "g2"]
        assert all(r.grammar == ("grammar", "a{1,3}") for r in reqs)
        rec.compiler.close()

    asyncio.run(main())


def test_compiler_rejects_a_group_whole_with_the_compilers_message() -> None:
    async def main() -> None:
        rec = _Recorder()
        rec.compiler.start("gw", [_req("b0", "(bad", "b"), _req("b1", "(bad", "b")])
        await _settle(rec)
        assert rec.submitted == []
        [(owner, rejections)] = rec.rejected
        assert owner == "gw" and [r.rid for r in rejections] == ["b0", "b1"]
        assert {r.code for r in rejections} == {grpc.StatusCode.INVALID_ARGUMENT}
        assert all("does not compile: bad at offset 1" in r.message for r in rejections)
        rec.compiler.close()

    asyncio.run(main())


def test_compiler_drops_requests_aborted_while_compiling() -> None:
    async def main() -> None:
        rec = _Recorder(delay_s=0.2)
        rec.compiler.start("gw1", [_req("a", "x")])
        rec.compiler.start("gw1", [_req("b", "(bad")])
        rec.compiler.start("gw2", [_req("c", "y")])
        rec.compiler.start("gw2", [_req("d0", "z", "d"), _req("d1", "z", "d")])
        rec.compiler.abort(["c", "d1"])
        rec.compiler.abort_owned("gw1")  # the gateway stream closed
        assert len(rec.compiler) == 1
        await _settle(rec)
        assert rec.rejected == []
        assert [(o, [r.rid for r in reqs]) for o, reqs in rec.submitted] == [("gw2", ["d0"])]
        rec.compiler.close()

    asyncio.run(main())


def test_queue_full_counts_requests_held_for_compilation() -> None:
    loop = EngineLoop(FakeEngine, Sink(), LoopConfig(max_waiting_requests=2,
                                                     max_running_requests=4))
    loop.stats = {"waiting_requests": 1, "running_requests": 2}  # 2 free slots: 0 queued
    assert not loop.queue_full() and not loop.queue_full(held=2)
    assert loop.queue_full(held=3)  # 4 waiting, 2 of them take the free slots: 2 queued


# -- the compile path through the in-process stack ------------------------------------------


def test_compile_limits_end_the_call_while_others_are_served(demo_path: str) -> None:
    """A real engine with small limits behind the in-process stack: too long a text and too slow
    a grammar each end their call with INVALID_ARGUMENT naming the limit and its flag; requests
    keep being served while the slow one compiles, and the compile pool serves new grammars
    after its worker was killed."""
    from radixserve.engine.config import EngineConfig
    from radixserve.engine.core import EngineCore

    core = EngineCore(EngineConfig(model_path=demo_path, device="cpu", dtype="float32",
                                   max_constraint_bytes=40000, grammar_compile_timeout_s=2.0))

    async def body(stack: InProcess, stub: Any) -> None:
        warm = await acollect(stub, request([5], max_new_tokens=8, regex="[ab]{1,3}"))
        assert warm.code == grpc.StatusCode.OK, warm.details
        big = await acollect(stub, request([5], max_new_tokens=8, regex="a" * 40001))
        assert big.code == grpc.StatusCode.INVALID_ARGUMENT and big.responses == []
        assert "regex is 40001 bytes long; the limit is 40000" in big.details
        assert "--max-constraint-bytes" in big.details
        # objects nested 400 deep (36 KB): 9-15 s to compile on the demo tokenizer
        slow = asyncio.create_task(
            acollect(stub, request([5], max_new_tokens=8, json_schema=nested_objects(400))))
        await until(lambda: len(stack.scheduler_app.compiler) == 1)
        served = 0
        while not slow.done():  # free and cached constrained requests go on meanwhile
            for extra in ({}, {"regex": "[ab]{1,3}"}):
                res = await acollect(stub, request([7], max_new_tokens=2, **extra))
                assert res.code == grpc.StatusCode.OK, res.details
                served += 1
        res = await slow
        assert res.code == grpc.StatusCode.INVALID_ARGUMENT and res.responses == []
        assert "json_schema did not compile within the 2 s limit" in res.details
        assert "--grammar-compile-timeout" in res.details
        assert served >= 2, served
        fresh = await acollect(stub, request([5], max_new_tokens=8, regex="(yes|no)"))
        assert fresh.code == grpc.StatusCode.OK, fresh.details
        await until(lambda: not core.has_work() and len(stack.scheduler_app.compiler) == 0
                    and stack.gateway.frontend.live_requests == 0)

    try:
        run_in_process(demo_path, body, core=core)
        core.check_integrity()
    finally:
        core.close()


def test_constrained_request_waits_for_its_grammar_and_others_do_not(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        constrained = asyncio.create_task(
            acollect(stub, request([5], max_new_tokens=3, regex="[ab]+")))
        await until(lambda: len(stack.scheduler_app.compiler) == 1)
        t0 = time.monotonic()
        free = await acollect(stub, request([7], max_new_tokens=2))
        # well under the grammar's 2 s, with room for a loaded 2-core machine
        assert free.code == grpc.StatusCode.OK and time.monotonic() - t0 < 1.2
        assert not constrained.done()
        res = await constrained
        assert res.code == grpc.StatusCode.OK and len(res.token_ids) == 3
        [(rid, grammar)] = stack.engine.grammars.items()
        assert grammar == ("grammar", "[ab]+")
        assert stack.engine.params_seen[rid].regex == "[ab]+"
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, compile_delay_s=2.0)


def test_bad_grammar_is_invalid_argument_and_never_reaches_the_engine(demo_path: str) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        res = await acollect(stub, request([5], max_new_tokens=3,
                                           ebnf='root ::= "bad'))
        assert res.code == grpc.StatusCode.INVALID_ARGUMENT, res.details
        assert "ebnf does not compile: bad at offset" in res.details and res.responses == []
        group = await acollect(stub, request([5], max_new_tokens=3, n=3, json_schema='{"bad"'))
        assert group.code == grpc.StatusCode.INVALID_ARGUMENT and group.responses == []
        assert stack.engine.added == []
        ok = await acollect(stub, request([5], max_new_tokens=2, n=3, seed=1, regex="a+"))
        assert ok.code == grpc.StatusCode.OK
        assert len(stack.engine.grammars) == 3  # the group, compiled once, added whole
        assert stack.engine.compiled.count(("regex", "a+")) == 1
        await until(lambda: idle(stack))

    run_in_process(demo_path, body)


@pytest.mark.parametrize("n", [1, 2])
def test_cancel_while_compiling_leaves_nothing_behind(demo_path: str, n: int) -> None:
    async def body(stack: InProcess, stub: Any) -> None:
        res = await acollect(stub, request([5], max_new_tokens=3, n=n, regex="c+"), timeout=0.3)
        assert res.code == grpc.StatusCode.DEADLINE_EXCEEDED
        await until(lambda: len(stack.scheduler_app.compiler) == 0)
        await until(lambda: stack.engine.compiled == [("regex", "c+")])
        await asyncio.sleep(0.2)  # the compile's result came back and was dropped
        assert stack.engine.added == [] and stack.engine.grammars == {}
        assert (await acollect(stub, request([5], max_new_tokens=1))).code == grpc.StatusCode.OK
        await until(lambda: idle(stack))

    run_in_process(demo_path, body, compile_delay_s=0.8)


def test_public_pb_fields_named_in_the_contract() -> None:
    oneof = pb.SamplingParams.DESCRIPTOR.oneofs_by_name["constraint"]
    assert [(f.name, f.number) for f in oneof.fields] == [
        ("json_schema", 10), ("regex", 11), ("ebnf", 12)]
