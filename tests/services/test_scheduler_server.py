"""The scheduler app's door (`SchedulerApp.accept` in `services/scheduler/server.py`): a Submit
message's requests reach the engine loop by whole groups, and a refused member refuses its whole
group at once, every member with the same status."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from radixserve.engine.sampling.params import SamplingParams
from svc_helpers import FakeEngine


def _submit_message(members: list[tuple[str, str]]) -> Any:
    from radixserve.internal.scheduler.v1 import scheduler_pb2 as pb
    from radixserve.services.gateway import convert as gateway_convert

    params = SamplingParams(max_new_tokens=4)
    return pb.SubmitRequest(requests=[
        gateway_convert.new_request_to_pb(rid, [5], params, True, group) for rid, group in members
    ], abort_ids=["old"])


def _at_the_door(msg: Any, serving: bool = True, waiting: int = 0) -> tuple[list[Any], list[Any]]:
    """(the loop's submissions, the rejections) for `msg` on a fresh app, queue limit 4."""
    from radixserve.services.scheduler import convert
    from radixserve.services.scheduler.loop import LoopConfig
    from radixserve.services.scheduler.server import SchedulerApp

    async def main() -> tuple[list[Any], list[Any]]:
        app = SchedulerApp(FakeEngine, "127.0.0.1:1", LoopConfig(max_waiting_requests=4))
        app.model_ready, app.link.connected = serving, True
        app.loop.stats = {"waiting_requests": waiting}
        submitted: list[Any] = []
        app.loop.submit = submitted.append  # type: ignore[method-assign]
        try:
            return submitted, app.accept(1, convert.incoming_from_pb(msg))
        finally:
            app.compiler.close()

    return asyncio.run(main())


def test_scheduler_refuses_a_group_whole_when_one_member_is_refused() -> None:
    msg = _submit_message([("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b"), ("c", "")])
    msg.requests[1].sampling.temperature = -1.0  # a1 does not make a valid request
    (submission,), rejected = _at_the_door(msg)
    assert [r.rid for r in submission.requests] == ["b0", "b1", "c"]
    assert list(submission.abort_ids) == ["old"]
    assert [r.rid for r in rejected] == ["a0", "a1"]
    assert {r.code for r in rejected} == {grpc.StatusCode.INVALID_ARGUMENT}
    assert len({r.message for r in rejected}) == 1 and "temperature" in rejected[0].message


def test_scheduler_refuses_every_group_whole_under_a_full_queue_or_when_not_serving() -> None:
    msg = _submit_message([("a0", "a"), ("a1", "a"), ("c", "")])
    for kwargs, code in (({"waiting": 4}, grpc.StatusCode.RESOURCE_EXHAUSTED),
                         ({"serving": False}, grpc.StatusCode.UNAVAILABLE)):
        (submission,), rejected = _at_the_door(msg, **kwargs)
        assert not submission.requests and list(submission.abort_ids) == ["old"]
        assert [(r.rid, r.code) for r in rejected] == [("a0", code), ("a1", code), ("c", code)]
