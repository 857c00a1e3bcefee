"""Greedy parity with transformers on random-weight checkpoints (float32, CPU):
docs/reliability.md #25."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from checkpoints import assert_outputs_vary, hf_greedy, hf_logits
from radixserve.engine import SamplingParams
from radixserve.engine.attention import StepLayout
from radixserve.engine.context import ForwardContext, forward_context

NEW_TOKENS = 16


def mixed_prompts(n: int = 16, seed: int = 0, vocab: int = 1000) -> list[list[int]]:
    """Prompts from 3 to 90 tokens; the long ones need several chunks at a 16-token budget."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.choice([3, 7, 15, 16, 17, 33, 64, 90]))]
            for _ in range(n)]


def greedy(n: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def references(ckpt):
    cache: dict[str, list[list[int]]] = {}

    def get(kind: str, prompts: list[list[int]]) -> list[list[int]]:
        key = f"{kind}:{hash(str(prompts))}"
        if key not in cache:
            cache[key] = hf_greedy(ckpt(kind), prompts, NEW_TOKENS)
        return cache[key]

    return get


CONFIGS = {
    "default": {},
    "chunked": {"max_prefill_tokens": 16},
    # chunks that shrink with their prompt's prefix (15 tokens at its start, 13 at 90 here)
    "chunked_by_compute": {"max_prefill_tokens": 16, "prefill_budget": "compute"},
    "page1": {"page_size": 1},
    "no_overlap": {"overlap": False},
    "naive_cache": {"cache": "naive"},
    "chunked_page4_no_overlap": {"max_prefill_tokens": 16, "page_size": 4, "overlap": False},
    # the piecewise-graph path (uncaptured on CPU): every step through the pieces; then pieces for
    # steps up to 40 tokens (buckets 16, 32, 40: padded rows) beside eager steps above that
    "pieces": {"piecewise_graph_max_tokens": 4096},
    "pieces_chunked": {"piecewise_graph_max_tokens": 40, "max_prefill_tokens": 16},
    "lpm_small_batch": {"schedule_policy": "lpm", "max_running_requests": 4,
                        "max_prefill_tokens": 32},
}


@pytest.mark.parametrize("kind", ["qwen3", "llama", "qwen2"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_batched_greedy_matches_transformers(kind, config, ckpt, references, make_llm):
    prompts = mixed_prompts()
    ref = references(kind, prompts)
    assert_outputs_vary(ref)
    llm = make_llm(ckpt(kind), **CONFIGS[config])
    got = [o.token_ids for o in llm.generate(prompts, greedy())]
    assert got == ref


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_prefix_cache_hits_keep_outputs(kind, page_size, ckpt, references, make_llm):
    rng = random.Random(1)
    shared = [rng.randrange(3, 1000) for _ in range(40)]
    prompts = [shared + [rng.randrange(3, 1000) for _ in range(rng.randint(1, 20))]
               for _ in range(8)]
    ref = references(kind, prompts)
    llm = make_llm(ckpt(kind), page_size=page_size, max_prefill_tokens=32)
    first = llm.generate(prompts[:1], greedy())  # warms the cache with the shared prefix
    rest = llm.generate(prompts[1:] + prompts[:1], greedy())
    assert [first[0].token_ids] + [o.token_ids for o in rest[:-1]] == ref
    assert rest[-1].token_ids == ref[0]  # the repeated prompt: fully cached but one token
    assert all(o.cached_tokens > 0 for o in rest)
    assert rest[-1].cached_tokens == (len(prompts[0]) - 1) // page_size * page_size
    assert llm.stats()["cached_tokens_total"] > 0


def test_radix_and_naive_agree(ckpt, make_llm):
    prompts = mixed_prompts(seed=3)
    radix_llm = make_llm(ckpt("qwen3"), cache="radix")
    naive_llm = make_llm(ckpt("qwen3"), cache="naive")
    # Second round repeats the prompts after the first finished, so the radix cache can hit.
    radix = radix_llm.generate(prompts, greedy()) + radix_llm.generate(prompts, greedy())
    naive = naive_llm.generate(prompts, greedy()) + naive_llm.generate(prompts, greedy())
    assert [o.token_ids for o in radix] == [o.token_ids for o in naive]
    assert sum(o.cached_tokens for o in radix) > 0 and sum(o.cached_tokens for o in naive) == 0


def test_sharded_untied_checkpoint_loads(ckpt, make_llm):
    prompts = mixed_prompts(4, seed=5)
    ref = hf_greedy(ckpt("qwen3_sharded"), prompts, NEW_TOKENS)
    got = make_llm(ckpt("qwen3_sharded")).generate(prompts, greedy())
    assert [o.token_ids for o in got] == ref


@pytest.mark.parametrize("kind", ["qwen3", "llama", "qwen2"])
def test_logprobs_match_transformers(kind, ckpt, make_llm):
    prompt = mixed_prompts(1, seed=7)[0]
    llm = make_llm(ckpt(kind))
    out = llm.generate([prompt],
                       SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True,
                                      top_logprobs=5))[0]
    ref = torch.log_softmax(hf_logits(ckpt(kind), prompt + out.token_ids[:-1]),
                            dim=-1)[len(prompt) - 1 :]
    for i, lp in enumerate(out.logprobs):
        assert abs(lp.logprob - ref[i, out.token_ids[i]].item()) < 2e-3
        for token, value in lp.top:
            assert abs(value - ref[i, token].item()) < 2e-3
        assert [t for t, _ in lp.top] == ref[i].topk(5).indices.tolist()


def test_completions_of_one_prompt_compute_its_kv_once(ckpt, make_llm):
    """Requests that follow the first of n completions (`after`) wait one step for its prompt
    pages to reach the radix cache, then reuse them: same tokens, the prompt computed once."""
    prompt = list(range(3, 43))  # 40 tokens: two full pages of 16, then 8
    params = [SamplingParams(temperature=1.0, seed=s, max_new_tokens=8, ignore_eos=True)
              for s in (1, 2, 3)]

    def run(follow: bool) -> tuple[list[list[int]], int, list[int]]:
        core = make_llm(ckpt("qwen3"), page_size=16).core
        for i, p in enumerate(params):
            core.add_request(f"r{i}", prompt, p, after="r0" if follow and i else None)
        out: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
        running = []
        while core.has_work():
            for o in core.step():
                out[o.rid] += o.token_ids
            running.append(core.stats()["running_requests"])
        return [out[f"r{i}"] for i in range(3)], core.stats()["cached_tokens_total"], running

    alone, alone_cached, alone_running = run(follow=False)
    shared, shared_cached, shared_running = run(follow=True)
    assert shared == alone and all(len(t) == 8 for t in shared)
    assert alone_cached == 0 and alone_running[0] == 3  # side by side: each computes the prompt
    assert shared_cached == 2 * 32 and shared_running[0] == 1  # the followers matched both pages


class EagerDecodeGraphs:
    """Stands in for the decode CUDA graphs (cuda_graph.py) on CPU: runs each decode layout it is
    handed eagerly, its inputs gathered from the tables as a replay gathers them."""

    def __init__(self, runner, max_batch: int) -> None:
        self.runner, self.max_batch = runner, max_batch
        self.prefill_steps = 0  # replayed steps with rows of one request's prompt

    def can_run(self, layout: StepLayout) -> bool:
        return len(layout.seq_lens) <= self.max_batch and layout.is_decode

    def replay(self, layout: StepLayout) -> torch.Tensor:
        r = self.runner
        self.prefill_steps += len(set(layout.slot_list)) < len(layout.slot_list)
        slots, pos = torch.tensor(layout.slot_list), torch.tensor(layout.prefix_lens)
        ids = r.table.token_pool[slots, pos]
        meta = r.backend.prepare(dataclasses.replace(layout,
                                                     out_loc=r.table.page_table[slots, pos]))
        with forward_context(ForwardContext(r.backend, meta, r.kv_pool)):
            return r.model.compute_logits(r.model(ids, pos))


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("config", [
    {"max_prefill_tokens": 16},  # chunks beside decode rows, every step through the graphs
    {"max_prefill_tokens": 16, "graph_prefill_keys": 600},  # short chunks only; eager beside
    {"page_size": 1, "max_prefill_tokens": 40},
])
def test_prefill_tokens_as_decode_graph_rows_match_transformers(kind, config, ckpt, references,
                                                                make_llm):
    """Steps with prefill tokens replayed by the decode graphs, each new token a row of its own
    (ModelRunner._graph_layout), give transformers' greedy tokens."""
    prompts = mixed_prompts()
    ref = references(kind, prompts)
    llm = make_llm(ckpt(kind), **{"graph_prefill_keys": 10**9, **config})
    graphs = EagerDecodeGraphs(llm.core.runner, max_batch=64)
    llm.core.runner.graphs = graphs
    got = [o.token_ids for o in llm.generate(prompts, greedy())]
    assert got == ref
    assert graphs.prefill_steps > 0


def test_decode_graphs_take_prefill_tokens_within_their_limits(ckpt, make_llm):
    """A step with prefill tokens replays the decode graphs only where its prompt tokens attend
    to at most graph_prefill_keys keys (0: never) and it fits the largest graph."""
    prompts = mixed_prompts(8, seed=2)
    seen = {}
    for limit, max_batch in ((0, 64), (10**9, 8), (10**9, 64)):
        llm = make_llm(ckpt("qwen3"), max_prefill_tokens=16, graph_prefill_keys=limit)
        graphs = EagerDecodeGraphs(llm.core.runner, max_batch)
        llm.core.runner.graphs = graphs
        seen[limit, max_batch] = ([o.token_ids for o in llm.generate(prompts, greedy())],
                                  graphs.prefill_steps)
    # 8 rows hold no 16-token chunk; 64 hold every step
    assert seen[0, 64][1] == seen[10**9, 8][1] == 0 < seen[10**9, 64][1]
    assert seen[0, 64][0] == seen[10**9, 8][0] == seen[10**9, 64][0]
