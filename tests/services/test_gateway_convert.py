"""The gateway's protobuf seam (`services/gateway/convert.py`) for what the links read: the
detokenizer's deltas, the scheduler's acks and the tokenizer's results, as domain types."""

from __future__ import annotations

import grpc
from radixserve.internal.common.v1 import common_pb2
from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok_pb
from radixserve.internal.scheduler.v1 import scheduler_pb2 as sched_pb
from radixserve.internal.tokenizer.v1 import tokenizer_pb2 as tok_pb
from radixserve.services.gateway import convert
from radixserve.services.gateway.types import Failure, Finish, JobResult, Output, StepTimes


def test_a_step_of_deltas_reads_into_outputs() -> None:
    """Each delta becomes an Output with its finish (reason, matched stop, counts); a reason the
    gateway does not know reads as aborted."""
    msg = detok_pb.SubscribeResponse(deltas=[
        detok_pb.RequestDelta(request_id="a", token_ids=[1, 2], text="hi"),
        detok_pb.RequestDelta(request_id="b", text="!", finish=detok_pb.Finish(
            reason=detok_pb.FINISH_REASON_STOP_STRING, stop_string="!", completion_tokens=3,
            cached_tokens=2)),
        detok_pb.RequestDelta(request_id="c", finish=detok_pb.Finish(
            reason=detok_pb.FINISH_REASON_STOP_TOKEN, stop_token_id=7)),
        detok_pb.RequestDelta(request_id="d", finish=detok_pb.Finish(reason=99)),
    ], step_unix_ns=42, received_unix_ns=43, detokenized_unix_ns=44,
       plain_request_ids=["p", "q"], plain_token_ids=[8, 9], plain_texts=[" x", ""])
    assert convert.step_times_from_pb(msg) == StepTimes(42, 43, 44)
    a, b, c, d, p, q = convert.outputs_from_pb(msg)
    assert a == Output("a", [1, 2], "hi", [], None, 42)
    # the packed plain deltas: one token and its text each
    assert (p, q) == (Output("p", [8], " x", [], None, 42), Output("q", [9], "", [], None, 42))
    assert d.step_unix_ns == 42  # every delta of the step carries its time
    assert b.finish == Finish("stop_string", "!", None, 3, 2)
    assert c.finish == Finish("stop_token", None, 7, 0, 0)
    assert d.finish is not None and d.finish.reason == "aborted"


def test_acks_and_job_results_carry_each_failure_with_its_status() -> None:
    status = common_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message="full")
    acks = convert.acks_from_pb(sched_pb.SubmitResponse(
        accepted_ids=["a"], rejected=[sched_pb.Rejection(request_id="b", status=status)]))
    assert acks.accepted == ["a"]
    assert acks.rejected == [("b", Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "full"))]
    results = convert.job_results_from_pb(tok_pb.ProcessResponse(results=[
        tok_pb.JobResult(job_id="e", token_ids=common_pb2.TokenIds(ids=[4, 5])),
        tok_pb.JobResult(job_id="d", text="hello"),
        tok_pb.JobResult(job_id="x", error=status),
    ]))
    assert results == [("e", JobResult([4, 5], "")), ("d", JobResult([], "hello")),
                       ("x", Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "full"))]
