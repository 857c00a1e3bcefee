"""What a Generate call's inbox holds, and how a backlog of it is taken at once.

The links and the frontend put into one call's queue: `Accepted` (the scheduler took it), `Aborted`
(the Abort RPC ended it), a `Failure` (a status for the call) or an internal `RequestDelta` of one
of its completions. A handler that falls behind takes the whole backlog and coalesces it.
"""

from __future__ import annotations

import asyncio
from typing import TypeAlias, TypeVar

from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok_pb
from radixserve.services.gateway.types import Failure


class Accepted:
    pass


class Aborted:
    pass


Item: TypeAlias = Accepted | Aborted | Failure | detok_pb.RequestDelta
T = TypeVar("T")


async def take_all(queue: asyncio.Queue[T]) -> list[T]:
    """Wait for one item, then take whatever else is already queued (a call's inbox, a link's
    outbox)."""
    items = [await queue.get()]
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def coalesce(items: list[Item]) -> list[Item]:
    """Joins each run of consecutive deltas into one (tokens, text and logprobs in order; a finish
    ends the run). A stream whose writes fell behind the engine then sends one message for the
    tokens that piled up instead of one per token, so a busy gateway catches up by itself."""
    out: list[Item] = []
    for item in items:
        last = out[-1] if out else None
        if (isinstance(item, detok_pb.RequestDelta) and isinstance(last, detok_pb.RequestDelta)
                and item.request_id == last.request_id and not last.HasField("finish")):
            merged = detok_pb.RequestDelta()
            merged.CopyFrom(last)
            merged.token_ids.extend(item.token_ids)
            merged.text = last.text + item.text
            merged.logprobs.extend(item.logprobs)
            if item.HasField("finish"):
                merged.finish.CopyFrom(item.finish)
            out[-1] = merged
        else:
            out.append(item)
    return out
