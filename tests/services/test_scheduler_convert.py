"""The scheduler's step message: every field a row of the engine's output carries reaches the
detokenizer, and a row sets only the fields it has."""

from __future__ import annotations

from radixserve.engine.core import StepOutput, TokenLogprobs
from radixserve.engine.sampling.params import SamplingParams
from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok_pb
from radixserve.services.scheduler import convert
from radixserve.services.scheduler.types import NewRequest, StepBatch


def test_step_message_carries_every_row_field() -> None:
    rows = [
        StepOutput("plain", [11], None, None, None, 7, 0),
        StepOutput("logprobs", [12, 13], [TokenLogprobs(-0.5, [(12, -0.5), (4, -1.25)]),
                                          TokenLogprobs(-2.0, [])], None, None, 9, 4),
        StepOutput("stopped", [2], None, "stop_token", 2, 3, 0),
        StepOutput("long", [5], None, "length", None, 3, 0),
    ]
    setup = NewRequest("new", list(range(1000)), SamplingParams(), passthrough=None)
    msg = convert.step_to_pb(StepBatch(["gone"], [setup], rows, 1_700_000_000_123_456_789))

    assert msg.step_unix_ns == 1_700_000_000_123_456_789  # the gateways time the hops from it
    assert list(msg.aborted_ids) == ["gone"]
    assert msg.setups[0].request_id == "new"
    assert len(msg.setups[0].prompt_ids) < 1000  # only the prompt's tail travels
    assert list(msg.setups[0].prompt_ids) == list(range(1000))[-len(msg.setups[0].prompt_ids):]

    plain, logprobs, stopped, long = msg.outputs
    assert (plain.request_id, list(plain.token_ids), plain.prompt_tokens) == ("plain", [11], 7)
    assert not plain.logprobs and plain.finish_reason == detok_pb.FINISH_REASON_UNSPECIFIED
    assert not plain.HasField("matched_stop_token")

    assert (list(logprobs.token_ids), logprobs.cached_tokens) == ([12, 13], 4)
    assert [lp.logprob for lp in logprobs.logprobs] == [-0.5, -2.0]
    assert [(t.token_id, t.logprob) for t in logprobs.logprobs[0].top] == [(12, -0.5), (4, -1.25)]
    assert not logprobs.logprobs[1].top

    assert stopped.finish_reason == detok_pb.FINISH_REASON_STOP_TOKEN
    assert stopped.matched_stop_token == 2
    assert long.finish_reason == detok_pb.FINISH_REASON_LENGTH
    assert not long.HasField("matched_stop_token")
