"""The gateway's per-stream inbox (`services/gateway/inbox.py`): queued outputs coalesce."""

from __future__ import annotations

from radixserve.services.gateway.types import Finish, Output


def _output(ids: list[int], text: str, finish: bool = False) -> Output:
    done = Finish("length", None, None, 5, 0) if finish else None
    return Output("r", ids, text, [-float(i) for i in ids], done, step_unix_ns=ids[0])


def test_gateway_joins_the_outputs_a_slow_stream_left_queued() -> None:
    """Outputs that piled up while a stream's writes lagged go out as one message, in order, with
    nothing lost; a non-output item (an abort, a failure) is never merged or reordered."""
    from radixserve.services.gateway.inbox import Aborted, coalesce

    aborted = Aborted()
    out = coalesce([_output([1], "a"), _output([2, 3], "bc"), aborted, _output([4], "d"),
                    _output([5], "é", finish=True), _output([6], "x")])
    assert len(out) == 4 and out[1] is aborted
    first, last = out[0], out[2]
    assert isinstance(first, Output) and isinstance(last, Output)
    assert first.token_ids == [1, 2, 3] and first.text == "abc" and first.finish is None
    assert first.logprobs == [-1.0, -2.0, -3.0]
    assert first.step_unix_ns == 1  # the earliest step's: how long its first token waited
    assert last.token_ids == [4, 5] and last.text == "dé"
    assert last.finish is not None and last.finish.completion_tokens == 5
    assert out[3].token_ids == [6]  # type: ignore[union-attr]  # nothing joins after a finish
