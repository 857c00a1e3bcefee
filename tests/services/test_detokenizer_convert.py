"""The detokenizer's messages both ways: every field of a step's rows reaches its state, and every
field of a delta (text, logprobs, each kind of finish) reaches the gateway."""

from __future__ import annotations

from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as pb
from radixserve.services.detokenizer import convert
from radixserve.services.detokenizer.state import Delta, Finish


def _logprobs() -> list[pb.TokenLogprobs]:
    return [pb.TokenLogprobs(logprob=-0.5, top=[pb.TopLogprob(token_id=12, logprob=-0.5)]),
            pb.TokenLogprobs(logprob=-2.0)]


def test_step_rows_reach_the_state() -> None:
    msg = pb.ProcessRequest(aborted_ids=["gone"], step_unix_ns=99)
    setup = msg.setups.add(request_id="new", prompt_ids=[1, 2, 3])
    setup.options.stop.append("END")
    setup.options.include_stop_str = True
    setup.options.subscriber = "g1"
    msg.outputs.add(request_id="plain", token_ids=[11], prompt_tokens=7)
    msg.outputs.add(request_id="lp", token_ids=[12, 13], logprobs=_logprobs(), cached_tokens=4)
    msg.outputs.add(request_id="stop", token_ids=[2], matched_stop_token=2,
                    finish_reason=pb.FINISH_REASON_STOP_TOKEN)
    msg.plain_request_ids.extend(["p1", "p2"])
    msg.plain_token_ids.extend([21, 22])

    step = convert.step_from_pb(msg)

    assert list(step.aborted) == ["gone"] and step.step_unix_ns == 99
    (s,) = step.setups
    assert (s.rid, list(s.prompt_ids), s.stop, s.include_stop_str, s.subscriber) == (
        "new", [1, 2, 3], ("END",), True, "g1")
    plain, lp, stop, p1, p2 = step.outputs
    assert [(o.rid, list(o.token_ids)) for o in (p1, p2)] == [("p1", [21]), ("p2", [22])]
    assert p1.finish_reason is None and not p1.logprobs and p1.prompt_tokens == 0
    assert (plain.rid, list(plain.token_ids), plain.prompt_tokens) == ("plain", [11], 7)
    assert plain.finish_reason is None and plain.matched_stop_token is None
    assert [x.logprob for x in lp.logprobs] == [-0.5, -2.0] and lp.cached_tokens == 4
    assert (stop.finish_reason, stop.matched_stop_token) == ("stop_token", 2)


def test_deltas_reach_the_gateway_with_every_field() -> None:
    deltas = [
        Delta("plain", [11], " hi", subscriber="g1"),
        Delta("lp", [12, 13], "ab", _logprobs()),
        Delta("str", [5], "x", finish=Finish("stop_string", "END", None, 9, 3, 2)),
        Delta("tok", [2], "", finish=Finish("stop_token", None, 2, 9, 4, 0)),
        Delta("len", [], "", finish=Finish("length", None, None, 9, 5, 0)),
    ]
    msg = pb.SubscribeResponse.FromString(
        convert.deltas_to_pb(deltas, 99, 100, 101).SerializeToString())
    # the scheduler's time for the step and this service's, for the gateways' metrics
    assert (msg.step_unix_ns, msg.received_unix_ns, msg.detokenized_unix_ns) == (99, 100, 101)

    # One token and nothing else: in the packed columns; every other delta is a message.
    assert (list(msg.plain_request_ids), list(msg.plain_token_ids), list(msg.plain_texts)) == (
        ["plain"], [11], [" hi"])
    lp, by_string, by_token, by_length = msg.deltas
    assert [x.logprob for x in lp.logprobs] == [-0.5, -2.0]
    assert [(t.token_id, t.logprob) for t in lp.logprobs[0].top] == [(12, -0.5)]
    f = by_string.finish
    assert (f.reason, f.stop_string, f.prompt_tokens, f.completion_tokens, f.cached_tokens) == (
        pb.FINISH_REASON_STOP_STRING, "END", 9, 3, 2)
    assert f.WhichOneof("matched_stop") == "stop_string"
    assert by_token.finish.WhichOneof("matched_stop") == "stop_token_id"
    assert by_token.finish.stop_token_id == 2
    assert by_length.finish.reason == pb.FINISH_REASON_LENGTH
    assert by_length.finish.WhichOneof("matched_stop") is None
    assert by_length.HasField("finish") and not by_length.token_ids
