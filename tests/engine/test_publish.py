"""Prefill pages reach the prefix cache as soon as they are computed, not only when requests end."""

from __future__ import annotations

import pytest
from checkpoints import checkpoint
from radixserve.engine import SamplingParams

PREFIX = [(7 * i + 3) % 900 + 3 for i in range(64)]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return checkpoint("qwen3", tmp_path_factory)


def drain(core) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while core.has_work():
        for step in core.step():
            out.setdefault(step.rid, []).extend(step.token_ids)
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_a_request_arriving_mid_decode_reuses_the_running_prefill(path, make_llm, overlap):
    alone = make_llm(path).generate([PREFIX + [11, 12]], GREEDY)[0].token_ids
    core = make_llm(path, page_size=16, overlap=overlap).core
    core.add_request("first", PREFIX + [5, 6, 7],
                     SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True))
    for _ in range(4):  # prefill, then a few decode steps: "first" is still running
        core.step()
    core.add_request("second", PREFIX + [11, 12], GREEDY)
    cached = {}
    tokens: dict[str, list[int]] = {}
    while core.has_work():
        for step in core.step():
            tokens.setdefault(step.rid, []).extend(step.token_ids)
            cached[step.rid] = step.cached_tokens
    assert cached["second"] == 64  # the whole shared prefix, while "first" was still decoding
    assert tokens["second"] == alone


def test_twins_admitted_together_end_up_sharing_pages(path, make_llm):
    core = make_llm(path, page_size=16, max_prefill_tokens=256).core
    core.add_request("a", PREFIX, GREEDY)
    core.add_request("b", PREFIX, GREEDY)
    core.step()  # both prefill in one step: two copies of the prefix pages
    core.step()  # the copies are published: b switches to a's pages and frees its own
    s = core.stats()
    # One shared copy of the four prompt pages, plus each request's own page for its outputs.
    assert s["kv_pages_protected"] == 4
    assert s["kv_pages_total"] - s["kv_pages_free"] == 4 + 2
    out = drain(core)
    assert out["a"] == out["b"]
