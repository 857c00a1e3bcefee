"""What a Generate call's inbox holds, and how a backlog of it is taken at once.

The links and the frontend put into one call's queue: `Accepted` (the scheduler took it), `Aborted`
(the Abort RPC ended it), a `Failure` (a status for the call) or an `Output` of one of its
completions. A handler that falls behind takes the whole backlog and coalesces it.
"""

from __future__ import annotations

import asyncio
from typing import TypeAlias, TypeVar

from radixserve.services.gateway.types import Failure, Output


class Accepted:
    pass


class Aborted:
    pass


Item: TypeAlias = Accepted | Aborted | Failure | Output
T = TypeVar("T")


async def take_all(queue: asyncio.Queue[T]) -> list[T]:
    """Wait for one item, then take whatever else is already queued (a call's inbox, a link's
    outbox)."""
    items = [await queue.get()]
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def coalesce(items: list[Item]) -> list[Item]:
    """Joins each run of consecutive outputs of one request into one (tokens, text and logprobs in
    order; a finish ends the run). A stream whose writes fell behind the engine then sends one
    message for the tokens that piled up instead of one per token, so a busy gateway catches up by
    itself."""
    if len(items) == 1:
        return items
    out: list[Item] = []
    for item in items:
        last = out[-1] if out else None
        if (isinstance(item, Output) and isinstance(last, Output) and item.rid == last.rid
                and last.finish is None):
            out[-1] = Output(last.rid, last.token_ids + item.token_ids, last.text + item.text,
                             last.logprobs + item.logprobs, item.finish, last.step_unix_ns)
        else:
            out.append(item)
    return out
