"""The scheduler servicer's group rule (`services/scheduler/server.py`): one refused member
refuses its whole group."""

from __future__ import annotations

import grpc
from radixserve.engine.sampling.params import SamplingParams


def test_scheduler_refuses_a_group_whole_when_one_member_is_refused() -> None:
    from radixserve.internal.scheduler.v1 import scheduler_pb2 as pb
    from radixserve.services.gateway import convert as gateway_convert
    from radixserve.services.scheduler import convert
    from radixserve.services.scheduler.server import _rejection, _without_refused_groups

    params = SamplingParams(max_new_tokens=4)
    msg = pb.SubmitRequest(requests=[
        gateway_convert.new_request_to_pb(rid, [5], params, True, group)
        for rid, group in (("a0", "a"), ("a1", "a"), ("b0", "b"), ("c", ""))
    ])
    taken = [convert.new_request_from_pb(m) for m in msg.requests if m.request_id != "a0"]
    rejected = [_rejection("a0", grpc.StatusCode.INVALID_ARGUMENT, "bad temperature")]
    kept = _without_refused_groups(msg, taken, rejected)
    assert [r.rid for r in kept] == ["b0", "c"]
    assert [(r.request_id, r.status.message) for r in rejected] == [
        ("a0", "bad temperature"), ("a1", "bad temperature")]
