"""Whole-or-nothing admission of a group: the n completions of one public request.

This module is where the rule lives. A group is the requests of one Submit message that share a
non-empty group id (the gateway sends the n completions of a call that way); an ungrouped request
is a group of one. A group is accepted whole or refused whole, and every member of a refused group
hears the same status, so the gateway ends the call on the first rejection it reads and has
nothing left to abort. Each stage a request passes through in the scheduler service decides for
the whole group:

- at the door (`screen`, called by `SchedulerApp.accept` on the event loop): one member that
  cannot be taken (not serving, queue full, fields that do not make a request) refuses its group;
- while grammars compile (`compile.split`): a group with a constrained member waits whole, and
  its compile result admits it or refuses it whole;
- into the engine (`add_whole`, called by the engine loop): a member that cannot be added (the
  queue filled up, a request too big for the KV pool) takes the members added before it back out,
  before the detokenizer hears of any of them.

Once added, the members are separate engine requests (each admitted to a slot on its own;
`EngineCore.add_request(after=...)` only lets later members reuse the first one's prompt KV).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

import grpc
from radixserve.services.scheduler.types import Rejection


class Member(Protocol):
    @property
    def rid(self) -> str: ...
    @property
    def group(self) -> str: ...


M = TypeVar("M", bound=Member)
N = TypeVar("N", bound=Member)


class Refused(Exception):
    """A member cannot be taken: its whole group is refused with this status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def partition(requests: Iterable[M]) -> list[list[M]]:
    """The groups of one message, in the order of their first member, each with its members in
    order; an ungrouped request alone."""
    out: list[list[M]] = []
    by_id: dict[str, list[M]] = {}
    for req in requests:
        if not req.group:
            out.append([req])
        elif req.group in by_id:
            by_id[req.group].append(req)
        else:
            by_id[req.group] = [req]
            out.append(by_id[req.group])
    return out


def refuse(group: Iterable[Member], refused: Refused) -> list[Rejection]:
    """Every member of `group`, refused with the same status."""
    return [Rejection(req.rid, refused.code, refused.message) for req in group]


def screen(requests: Iterable[M], take: Callable[[M], N]) -> tuple[list[N], list[Rejection]]:
    """(what `take` made of each member of the groups it took whole, rejections for every member
    of the others). `take` raises Refused for a member that cannot be taken."""
    taken: list[N] = []
    rejected: list[Rejection] = []
    for group in partition(requests):
        try:
            members = [take(req) for req in group]
        except Refused as exc:
            rejected += refuse(group, exc)
        else:
            taken += members
    return taken, rejected


def add_whole(group: Sequence[M], add: Callable[[M], None],
              take_back: Callable[[M], None]) -> list[Rejection]:
    """Add every member of `group`, in order, or none: when `add` raises Refused for one, the
    members added before it are taken back out and every member is refused with its status.
    Returns the rejections ([] when the whole group was added)."""
    added: list[M] = []
    for req in group:
        try:
            add(req)
        except Refused as exc:
            for taken in added:
                take_back(taken)
            return refuse(group, exc)
        added.append(req)
    return []
