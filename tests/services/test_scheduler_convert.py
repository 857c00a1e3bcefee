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

    # A row of one token and nothing else goes into the packed columns; the others are messages.
    assert list(msg.plain_request_ids) == ["plain"] and list(msg.plain_token_ids) == [11]
    logprobs, stopped, long = msg.outputs

    assert (list(logprobs.token_ids), logprobs.cached_tokens) == ([12, 13], 4)
    assert [lp.logprob for lp in logprobs.logprobs] == [-0.5, -2.0]
    assert [(t.token_id, t.logprob) for t in logprobs.logprobs[0].top] == [(12, -0.5), (4, -1.25)]
    assert not logprobs.logprobs[1].top

    assert stopped.finish_reason == detok_pb.FINISH_REASON_STOP_TOKEN
    assert stopped.matched_stop_token == 2
    assert long.finish_reason == detok_pb.FINISH_REASON_LENGTH
    assert not long.HasField("matched_stop_token")


def test_plain_rows_reach_the_detokenizer_and_the_finish_keeps_its_counts() -> None:
    """A request whose rows all travel packed but the last still finishes with the prompt and
    cached counts of that last row, after the same text as row by row."""
    from radixserve.engine.demo import train_tokenizer
    from radixserve.engine.detokenize import IncrementalDetokenizer
    from radixserve.services.detokenizer import convert as detok_convert
    from radixserve.services.detokenizer.state import DetokenizerState

    tok = train_tokenizer()
    ids = tok.encode("Hello there, world").ids
    state = DetokenizerState(lambda s: IncrementalDetokenizer(tok, s.prompt_ids))
    setup = NewRequest("r", [1, 2], SamplingParams(), passthrough=None)
    texts, finishes = [], []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        row = StepOutput("r", [token], None, "length" if last else None, None, 2, 1)
        msg = convert.step_to_pb(StepBatch([], [setup] if i == 0 else [], [row]))
        assert len(msg.outputs) == int(last) and len(msg.plain_request_ids) == int(not last)
        wire = detok_pb.ProcessRequest.FromString(msg.SerializeToString())
        for delta in state.apply(detok_convert.step_from_pb(wire)).deltas:
            texts.append(delta.text)
            finishes.append(delta.finish)
    assert "".join(texts) == tok.decode(ids)
    *running, finish = finishes
    assert not any(running)
    assert (finish.reason, finish.prompt_tokens, finish.cached_tokens,
            finish.completion_tokens) == ("length", 2, 1, len(ids))
