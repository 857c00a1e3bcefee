"""The group rule of the scheduler service (`services/scheduler/groups.py`): the n completions of
one request are taken whole or refused whole, each member with the same status."""

from __future__ import annotations

from typing import NamedTuple

import grpc
import pytest
from radixserve.services.scheduler.groups import Refused, add_whole, partition, screen

FULL = Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")


class Req(NamedTuple):
    rid: str
    group: str = ""


def test_partition_puts_each_group_together_in_order_of_its_first_member() -> None:
    reqs = [Req("a0", "a"), Req("u"), Req("b0", "b"), Req("a1", "a"), Req("b1", "b"), Req("v")]
    assert [[r.rid for r in g] for g in partition(reqs)] == [
        ["a0", "a1"], ["u"], ["b0", "b1"], ["v"]]


def test_screen_refuses_a_group_whole_when_one_member_is_refused() -> None:
    """A member that cannot be taken refuses its group, every member with that member's status;
    other groups and ungrouped requests are not touched."""
    reqs = [Req("a0", "a"), Req("a1", "a"), Req("a2", "a"), Req("b0", "b"), Req("c")]

    def take(req: Req) -> str:
        if req.rid == "a1":
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "bad temperature")
        return req.rid

    taken, rejected = screen(reqs, take)
    assert taken == ["b0", "c"]
    assert [(r.rid, r.code, r.message) for r in rejected] == [
        (rid, grpc.StatusCode.INVALID_ARGUMENT, "bad temperature") for rid in ("a0", "a1", "a2")]


def test_screen_under_a_full_queue_refuses_every_member_and_takes_none() -> None:
    def full(req: Req) -> Req:
        raise FULL

    taken, rejected = screen([Req("a0", "a"), Req("a1", "a"), Req("u")], full)
    assert taken == []
    assert {r.rid: r.code for r in rejected} == {
        "a0": grpc.StatusCode.RESOURCE_EXHAUSTED, "a1": grpc.StatusCode.RESOURCE_EXHAUSTED,
        "u": grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.mark.parametrize("room", [0, 1, 2, 3])
def test_add_whole_adds_all_of_a_group_or_none(room: int) -> None:
    """With room for fewer members than the group has (a full queue, too few free slots), the
    members added before the refusal are taken back out and nothing of the group stays."""
    group = [Req(f"g{i}", "g") for i in range(3)]
    held: list[str] = []

    def add(req: Req) -> None:
        if len(held) >= room:
            raise FULL
        held.append(req.rid)

    rejected = add_whole(group, add, lambda req: held.remove(req.rid))
    if room >= len(group):
        assert rejected == [] and held == ["g0", "g1", "g2"]
    else:
        assert held == []
        assert [(r.rid, r.message) for r in rejected] == [(f"g{i}", "queue full") for i in range(3)]
