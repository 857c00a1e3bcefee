"""`radixserve bench plane` times each part of a step's way through the plane's conversions."""

from __future__ import annotations

from radixserve.bench.plane import measure


def test_each_part_of_a_step_is_timed() -> None:
    from radixserve.engine.demo import demo_model_path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_path()))
    ms = measure(tokenizer, rows=6, steps=4, prompt_len=5)
    assert set(ms) == {"scheduler", "detokenizer", "gateways"}
    assert all(0 < value < 1000 for value in ms.values())
