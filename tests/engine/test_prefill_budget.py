"""`prefill_budget`: a step's max_prefill_tokens counted in tokens, or in compute, where a token
also pays for the keys it attends to, so that chunks deep into a long prompt are shorter."""

from __future__ import annotations

import random

import pytest
from radixserve.engine import SamplingParams
from radixserve.engine.scheduler.prefill_budget import PrefillBudget, keys_per_token

QWEN3_0_6B = keys_per_token(1024, 3072, 16, 8, 128)


def test_keys_per_token_of_public_shapes():
    # projections 2 x 15.7M FLOPs a token a layer; 4 x 16 heads x 128 FLOPs a key
    assert QWEN3_0_6B == 3840.0
    assert keys_per_token(4096, 12288, 32, 8, 128) == 23552.0  # Qwen3-8B


def test_a_token_budget_counts_tokens():
    b = PrefillBudget()
    assert b.cost(100, 612) == 512
    assert b.chunk_end(100, 10_000, 512) == 612
    assert b.chunk_end(100, 300, 512) == 300  # the prompt ends first


def test_a_compute_budget_fills_each_chunk_and_no_more():
    b = PrefillBudget("compute", QWEN3_0_6B)
    rng = random.Random(0)
    for _ in range(2000):
        start, budget = rng.randrange(0, 40_000), rng.uniform(1, 9000)
        end = b.chunk_end(start, 10**9, budget)
        assert end > start
        if end - start > 1:  # a single token is allowed over budget: a step always progresses
            assert b.cost(start, end) <= budget
        assert b.cost(start, end + 1) > budget
        mid = rng.randrange(start, end + 1)
        assert b.cost(start, mid) + b.cost(mid, end) == pytest.approx(b.cost(start, end))


def test_chunks_shrink_as_a_long_prompt_goes_on():
    b = PrefillBudget("compute", QWEN3_0_6B)
    ends, start = [], 0
    while start < 16384:
        start = b.chunk_end(start, 16384, 4096)
        ends.append(start)
    sizes = [e - s for s, e in zip([0, *ends], ends)]
    assert sizes[0] == 2957 and sizes[-2] < sizes[0] // 3  # the last chunk is what was left
    assert all(a >= c for a, c in zip(sizes, sizes[1:-1]))
    assert 4096 * 0.99 < b.cost(ends[-3], ends[-2]) <= 4096


def test_a_compute_budget_needs_the_model_shapes():
    with pytest.raises(ValueError, match="keys_per_token"):
        PrefillBudget("compute")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from checkpoints import checkpoint

    return checkpoint("qwen3", tmp_path_factory)


def _prefill_costs(core) -> list[float]:
    """Run the core to the end; the compute each step's prefill chunks took."""
    budget, costs = core.scheduler.budget, []
    while core.has_work():
        core.step()
        if core._in_flight is not None:  # the step just launched (overlap on)
            b = core._in_flight[0]
            costs.append(sum(budget.cost(p, s) for p, s, r in
                             zip(b.prefix_lens, b.seq_lens, b.reqs) if p < r.fill_len))
    return costs


def test_the_engine_keeps_each_step_within_a_compute_budget(path, make_llm):
    """A long prompt beside short ones: every step's prefill fits the budget (one token over at
    most), later chunks of the long prompt are shorter, and the tokens are those of a token
    budget."""
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (400, 9, 30, 5)]
    params = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    outs = {}
    for unit in ("tokens", "compute"):
        llm = make_llm(path, max_prefill_tokens=32, prefill_budget=unit)
        core = llm.core
        for i, p in enumerate(prompts):
            core.add_request(f"r{i}", p, params)
        costs = _prefill_costs(core)
        if unit == "compute":
            r = core.scheduler.budget._r
            assert all(c <= 32 + 1 + 400 / r for c in costs), costs
            assert len(costs) > 400 // 32 + 2  # more, shorter chunks than by tokens
        outs[unit] = [o.token_ids for o in llm.generate(prompts, params)]
    assert outs["tokens"] == outs["compute"]
