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
