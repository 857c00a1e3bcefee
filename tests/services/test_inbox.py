"""The gateway's per-stream inbox (`services/gateway/inbox.py`): queued deltas coalesce."""

from __future__ import annotations

from typing import Any


def test_gateway_joins_the_deltas_a_slow_stream_left_queued() -> None:
    """Deltas that piled up while a stream's writes lagged go out as one message, in order, with
    nothing lost; a non-delta item (an abort, a failure) is never merged or reordered."""
    from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok_pb
    from radixserve.services.gateway.inbox import Aborted, coalesce

    def delta(ids: list[int], text: str, finish: bool = False) -> Any:
        d = detok_pb.RequestDelta(request_id="r", token_ids=ids, text=text,
                                  logprobs=[detok_pb.TokenLogprobs(logprob=-float(i)) for i in ids])
        if finish:
            d.finish.completion_tokens = 5
        return d

    aborted = Aborted()
    out = coalesce([delta([1], "a"), delta([2, 3], "bc"), aborted, delta([4], "d"),
                    delta([5], "é", finish=True), delta([6], "x")])
    assert len(out) == 4 and out[1] is aborted
    first, last = out[0], out[2]
    assert list(first.token_ids) == [1, 2, 3] and first.text == "abc"
    assert not first.HasField("finish")
    assert [lp.logprob for lp in first.logprobs] == [-1.0, -2.0, -3.0]
    assert list(last.token_ids) == [4, 5] and last.text == "dé"
    assert last.finish.completion_tokens == 5
    assert list(out[3].token_ids) == [6]  # nothing joins a delta after a finish
