"""Per-request detokenizer state (`services/detokenizer/state.py`): deltas, stop strings, and
when each request's state is dropped."""

from __future__ import annotations

from typing import Any

import pytest
from radixserve.services.detokenizer.state import DetokenizerState, Output, Setup, Step


@pytest.fixture(scope="module")
def hf_tokenizer(demo_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_path)


def test_detokenizer_state_lifetimes(hf_tokenizer: Any) -> None:
    from radixserve.engine.detokenize import IncrementalDetokenizer

    state = DetokenizerState(lambda s: IncrementalDetokenizer(
        hf_tokenizer, s.prompt_ids, s.stop, s.include_stop_str, s.skip_special_tokens))
    ids = hf_tokenizer.encode(" one two three four")
    r = state.apply(Step(setups=[Setup("a", [1]), Setup("b", [1], stop=(" three",))],
                         outputs=[Output("a", ids[:2]), Output("b", ids[:2])]))
    assert [d.text for d in r.deltas] == [" one two", " one two"] and not r.abort_ids
    r = state.apply(Step(outputs=[Output("b", ids[2:]), Output("a", ids[2:], "length",
                                                                 prompt_tokens=1)]))
    by_rid = {d.rid: d for d in r.deltas}
    assert by_rid["b"].finish is not None and by_rid["b"].finish.reason == "stop_string"
    assert by_rid["b"].finish.stop_string == " three" and by_rid["b"].text == ""
    assert r.abort_ids == ["b"]  # the engine must stop generating it
    assert by_rid["a"].text == " three four" and by_rid["a"].finish.completion_tokens == len(ids)
    assert len(state) == 0
    # Late output of a finished request, abort of an unknown one: ignored, nothing held.
    r = state.apply(Step(aborted=["zzz"], outputs=[Output("b", ids[:1])]))
    assert r.deltas == [] and len(state) == 0
    state.apply(Step(setups=[Setup("c", [1])]))
    state.apply(Step(aborted=["c"]))
    assert len(state) == 0
    state.apply(Step(setups=[Setup("d", [1])]))
    state.reset()
    assert len(state) == 0


def _run(state: DetokenizerState, ids: list[int], stop: tuple[str, ...] = ()) -> list[Any]:
    """One request fed a token a step, its last output finishing on length; every delta sent."""
    sent = list(state.apply(Step(setups=[Setup("r", [1], stop=stop)])).deltas)
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        result = state.apply(Step(outputs=[Output("r", [token], "length" if last else None,
                                                  prompt_tokens=1, logprobs=[float(i)])]))
        sent += result.deltas
        if result.abort_ids:
            break
    return sent


@pytest.mark.parametrize("interval", [2, 3, 8])
def test_stream_interval_joins_deltas_and_loses_nothing(hf_tokenizer: Any, interval: int) -> None:
    """After its first token a stream's deltas go out `interval` tokens at a time, the last at its
    finish; tokens, text, logprobs and the finish equal what interval 1 sends."""
    from radixserve.engine.detokenize import IncrementalDetokenizer

    def state(n: int) -> DetokenizerState:
        return DetokenizerState(lambda s: IncrementalDetokenizer(
            hf_tokenizer, s.prompt_ids, s.stop, s.include_stop_str, s.skip_special_tokens), n)

    ids = hf_tokenizer.encode(" one two three four five six seven")
    every, joined = _run(state(1), ids), _run(s := state(interval), ids)
    assert [len(d.token_ids) for d in every] == [1] * len(ids)
    sizes = [len(d.token_ids) for d in joined]
    assert sizes[0] == 1 and all(n == interval for n in sizes[1:-1]) and 1 <= sizes[-1] <= interval
    for field in ("token_ids", "logprobs"):
        assert [x for d in joined for x in getattr(d, field)] == \
            [x for d in every for x in getattr(d, field)]
    assert "".join(d.text for d in joined) == "".join(d.text for d in every)
    assert joined[-1].finish == every[-1].finish and len(s) == 0
    # A stop string still ends the request at the same token, with the same text and abort.
    every, joined = _run(state(1), ids, (" four",)), _run(state(interval), ids, (" four",))
    assert joined[-1].finish == every[-1].finish and joined[-1].finish.reason == "stop_string"
    assert "".join(d.text for d in joined) == "".join(d.text for d in every) == " one two three"
    assert [x for d in joined for x in d.token_ids] == [x for d in every for x in d.token_ids]


def test_stream_interval_drops_what_an_aborted_stream_held(hf_tokenizer: Any) -> None:
    from radixserve.engine.detokenize import IncrementalDetokenizer

    state = DetokenizerState(lambda s: IncrementalDetokenizer(
        hf_tokenizer, s.prompt_ids, s.stop, s.include_stop_str, s.skip_special_tokens), 4)
    ids = hf_tokenizer.encode(" one two three")
    sent = state.apply(Step(setups=[Setup("r", [1])], outputs=[Output("r", ids[:1])])).deltas
    assert len(sent) == 1  # the first token at once
    assert state.apply(Step(outputs=[Output("r", ids[1:2])])).deltas == []  # held
    assert state.apply(Step(aborted=["r"])).deltas == [] and len(state) == 0
    with pytest.raises(ValueError, match="stream interval"):
        DetokenizerState(lambda s: None, 0)  # type: ignore[arg-type,return-value]
