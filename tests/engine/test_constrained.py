"""Structured output (engine/constrained/): every constrained output is in its grammar's language,
and constraints change nothing else (neighbours, overlap, chunking, the cache, retraction)."""

from __future__ import annotations

import json
import re
import sys
import threading

import jsonschema
import pytest
import torch
from engine_pool import register_engine
from radixserve.engine import LLM, InvalidRequestError, SamplingParams
from radixserve.engine.constrained.bitmask import apply_grammar_mask, fill_grammar_mask, to_device
from radixserve.engine.constrained.compiler import GrammarCompiler
from radixserve.engine.constrained.matcher import GrammarMatcher
from transformers import AutoTokenizer

# Finite (or bounded) languages only: the weights are random, so only the grammar ends an output.
SCHEMAS = [
    {"type": "object", "properties": {"name": {"enum": ["ann", "bob", "cy"]},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
    # A pattern, because xgrammar lets raw control characters into strings, which JSON forbids.
    {"type": "object", "properties": {"tag": {"type": "string",
                                              "pattern": "^[a-z ]{0,5}$"}},
     "required": ["tag"], "additionalProperties": False},
    {"enum": ["red", "green", "blue"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"},
                                      "xs": {"type": "array", "maxItems": 3,
                                             "items": {"enum": [1, 2, 3]}}},
     "required": ["ok", "xs"], "additionalProperties": False},
]
REGEXES = [r"[a-c]{1,3}-\d{2}", r"(yes|no|maybe)", r"\d{3}-\d{4}",
           r"[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5}){0,2}", r"(0|[1-9][0-9]{0,2})\.[0-9]{1,2}"]
MAX_NEW = 64  # more than any output of these languages needs
NUM_CONSTRAINED, NUM_FREE = 50, 14


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from checkpoints import checkpoint

    return checkpoint("qwen3", tmp_path_factory)


def prompt(i: int) -> list[int]:
    # Lengths 6..28 with a shared head every third prompt, so the radix cache has reuse to offer.
    return ([11, 12, 13, 14, 15, 16, 17, 18] if i % 3 == 0 else []) + [
        (i * 37 + j * 11) % 900 + 3 for j in range(6 + i % 13)]


def sampling(i: int, **kw) -> SamplingParams:
    """Seeded: greedy, tempered, or nucleus by turns."""
    style = [dict(temperature=0), dict(temperature=1.0), dict(temperature=0.8, top_p=0.9, top_k=50)]
    return SamplingParams(**style[i % 3], seed=1000 + i, max_new_tokens=MAX_NEW, **kw)


def constraint(i: int) -> dict:
    if i % 2 == 0:
        return {"json_schema": SCHEMAS[(i // 2) % len(SCHEMAS)]}
    return {"regex": REGEXES[(i // 2) % len(REGEXES)]}


def workload() -> tuple[list[list[int]], list[SamplingParams]]:
    """NUM_CONSTRAINED constrained requests with NUM_FREE unconstrained ones spread among them."""
    prompts, params = [], []
    for i in range(NUM_CONSTRAINED + NUM_FREE):
        prompts.append(prompt(i))
        free = i % 4 == 3 and i // 4 < NUM_FREE
        params.append(sampling(i, ignore_eos=True) if free else sampling(i, **constraint(i)))
    return prompts, params


def check_in_language(outs, params) -> int:
    """Every constrained output ended by its grammar and belongs to its language."""
    checked = 0
    for out, p in zip(outs, params):
        if p.constraint is None:
            continue
        kind, text = p.constraint
        assert out.finish_reason == "eos", (kind, text, out.text, out.finish_reason)
        if kind == "json_schema":
            jsonschema.validate(json.loads(out.text), json.loads(text))
        else:
            assert re.fullmatch(text, out.text), (text, out.text)
        checked += 1
    return checked


def ids(outs):
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def reference(path):
    """The workload's outputs with overlap off and no pressure, checked once."""
    prompts, params = workload()
    outs = LLM(str(path), device="cpu", dtype="float32", overlap=False).generate(prompts, params)
    assert check_in_language(outs, params) == NUM_CONSTRAINED
    return prompts, params, ids(outs)


def test_constrained_batch_is_valid_and_leaves_neighbours_alone(path, make_llm, reference):
    prompts, params, expected = reference
    outs = make_llm(path).generate(prompts, params)  # overlap on
    assert check_in_language(outs, params) == NUM_CONSTRAINED
    assert ids(outs) == expected  # overlap on == off
    free = [i for i, p in enumerate(params) if p.constraint is None]
    assert len(free) == NUM_FREE
    alone = make_llm(path).generate([prompts[i] for i in free], [params[i] for i in free])
    assert ids(alone) == [expected[i] for i in free]
    # The grammar did change the constrained outputs (the mask is applied at all).
    unconstrained = [SamplingParams(**{**p.__dict__, "json_schema": None, "regex": None})
                     for p in params[:6]]
    assert ids(make_llm(path).generate(prompts[:6], unconstrained)) != expected[:6]


@pytest.mark.parametrize("overlap", [True, False])
def test_chunked_prefill_and_radix_reuse(path, make_llm, reference, overlap):
    prompts, params, expected = reference
    llm = make_llm(path, max_prefill_tokens=8, page_size=2, overlap=overlap)
    assert ids(llm.generate(prompts, params)) == expected
    again = llm.generate(prompts, params)  # every prompt is in the cache now
    assert ids(again) == expected
    assert all(o.cached_tokens > 0 for o in again)


@pytest.mark.parametrize("overlap", [True, False])
def test_retraction_keeps_matchers_consistent(path, make_llm, reference, overlap):
    prompts, params, expected = reference
    demand = sum(-(-(len(p) + len(out)) // 2) for p, out in zip(prompts, expected))
    llm = make_llm(path, num_pages=int(0.1 * demand), page_size=2, overlap=overlap,
                   admission="optimistic")
    scheduler = llm.core.scheduler
    retracted: list[tuple[bool, int]] = []  # (constrained, tokens in flight) per retraction
    retract = scheduler._retract

    def watch(req):
        in_flight = req.num_scheduled_outputs - len(req.output_ids)
        retracted.append((req.grammar is not None, in_flight))
        retract(req)

    scheduler._retract = watch
    assert ids(llm.generate(prompts, params)) == expected
    constrained = [n for c, n in retracted if c]
    assert constrained, "no constrained request was retracted"
    if overlap:  # the tricky case: a retracted constrained row with its token still in flight
        assert any(constrained)


@pytest.mark.parametrize("overlap", [True, False])
def test_n_completions_have_their_own_matchers(path, make_llm, overlap):
    llm = make_llm(path, overlap=overlap)
    core = llm.core
    schema = SCHEMAS[0]
    ps = [sampling(1 + 3 * k, json_schema=schema) for k in range(4)]  # temperature 1, own seeds
    grammar = core.compile_grammar(ps[0])
    for k, p in enumerate(ps):
        core.add_request(f"n{k}", prompt(3), p, after="n0" if k else None, grammar=grammar)
    got: dict[str, list[int]] = {f"n{k}": [] for k in range(4)}
    reasons = {}
    while core.has_work():
        for s in core.step():
            got[s.rid] += s.token_ids
            if s.finish_reason:
                reasons[s.rid] = s.finish_reason
    assert set(reasons.values()) == {"eos"}
    alone = make_llm(path, overlap=overlap).generate([prompt(3)] * 4, ps)
    assert list(got.values()) == ids(alone)
    assert len({tuple(v) for v in got.values()}) > 1  # the seeds differ, and so do the outputs
    check_in_language(alone, ps)


def test_stop_token_ends_a_complete_output(path, make_llm):
    # An EBNF whose language is "ab" or "abab": the request's stop token ends it once complete.
    stop = 7
    p = SamplingParams(ebnf='root ::= "ab" | "abab"', stop_token_ids=(stop,), temperature=0,
                       max_new_tokens=30)
    out = make_llm(path).generate([prompt(2)], p)[0]
    assert out.finish_reason in ("eos", "stop_token")
    assert out.text in ("ab", "abab")
    if out.finish_reason == "stop_token":
        assert out.token_ids[-1] == stop == out.matched_stop
    # A limit too small for the grammar: "length", and the output is a prefix of the language.
    short = make_llm(path).generate([prompt(2)], SamplingParams(regex=r"[a-z]{20}", seed=5,
                                                                max_new_tokens=3))[0]
    assert short.finish_reason == "length" and re.fullmatch(r"[a-z]{1,19}", short.text)


def test_bad_grammar_raises_with_the_compiler_message(path, make_llm):
    llm = make_llm(path)
    with pytest.raises(InvalidRequestError, match=r"regex does not compile: .*Unclosed '\['"):
        llm.core.compile_grammar(SamplingParams(regex="[a-"))
    with pytest.raises(InvalidRequestError, match='ebnf does not compile: .*Rule "foo"'):
        llm.generate([prompt(0), prompt(1)],
                     [SamplingParams(), SamplingParams(ebnf="root ::= foo")])
    with pytest.raises(InvalidRequestError, match="json_schema does not compile"):
        llm.generate([prompt(0)], SamplingParams(json_schema="{not json"))
    assert not llm.core.has_work()  # all or nothing: no request left behind
    assert llm.core.compile_grammar(SamplingParams()) is None
    grammar = llm.core.compile_grammar(SamplingParams(regex="a"))
    with pytest.raises(InvalidRequestError, match="not the request's constraint"):
        llm.core.add_request("x", prompt(0), SamplingParams(regex="b"), grammar=grammar)


def test_compiler_cache_is_bounded_and_thread_safe(path):
    compiler = GrammarCompiler(str(path), 1024, (2,), cache_size=4)
    results: dict[int, object] = {}

    def work(t: int) -> None:
        for k in range(6):
            results[t * 10 + k] = compiler.compile("regex", f"x{{{k % 3 + 1}}}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(g) for g in results.values()}) == 3  # one object per text
    for k in range(8):
        compiler.compile("regex", f"y{k}")
    assert compiler.cache_len() == 4


def test_mask_bans_ids_past_the_tokenizer_and_applies_to_its_rows(path):
    # A model vocabulary larger than the tokenizer's (1024): those ids are never allowed.
    compiler = GrammarCompiler(str(path), 1030, (2,))
    matcher = GrammarMatcher(compiler.compile("regex", "(yes|no)"), (2,))
    mask = fill_grammar_mask([None, matcher, None], 1030)
    assert mask is not None and mask.bits.shape == (1, 33) and mask.rows == [1]
    logits = torch.randn(3, 1030)
    out = apply_grammar_mask(logits, to_device(mask, torch.device("cpu")))
    assert torch.equal(out[[0, 2]], logits[[0, 2]])
    allowed = torch.isfinite(out[1]).nonzero().flatten().tolist()
    assert allowed and max(allowed) < 1024 and 2 not in allowed  # EOS only once complete
    assert torch.equal(out[1, allowed], logits[1, allowed])
    assert fill_grammar_mask([None, None], 1030) is None


def test_batched_mask_fill_equals_one_row_at_a_time(path):
    # fill_grammar_mask hands several rows to xgrammar's threads: each row must be its own
    # matcher's, whatever state each is in (a different grammar, or the same one further along).
    compiler = GrammarCompiler(str(path), 1030, (2,))
    tok = AutoTokenizer.from_pretrained(str(path))
    matchers = []
    for kind, text, accepted in [("regex", "(yes|no)", ""), ("regex", "(yes|no)", "y"),
                                 ("regex", r"\d{3}-\d{4}", "12"), ("json_schema",
                                  json.dumps(SCHEMAS[0]), '{"name": "bob", '),
                                 ("regex", "[a-c]{1,3}", "ab")]:
        matcher = GrammarMatcher(compiler.compile(kind, text), (2,))
        for token in tok.encode(accepted, add_special_tokens=False):
            assert matcher.accept(token), (text, accepted)
        matchers.append(matcher)
    mask = fill_grammar_mask([matchers[0], None, *matchers[1:]], 1030)
    assert mask is not None and mask.rows == [0, 2, 3, 4, 5]
    one = torch.empty((1, 33), dtype=torch.int32)
    for i, matcher in enumerate(matchers):
        matcher.fill(one, 0)
        assert torch.equal(mask.bits[i], one[0]), i
    assert len({tuple(row.tolist()) for row in mask.bits}) == len(matchers)


def test_unconstrained_requests_need_no_xgrammar(path, make_llm, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now fails
    llm = make_llm(path)
    assert llm.generate([prompt(0)], SamplingParams(max_new_tokens=4))[0].finish_reason
    with pytest.raises(InvalidRequestError, match="needs the xgrammar package"):
        llm.generate([prompt(0)], SamplingParams(regex="a+"))


@pytest.mark.parametrize("overlap", [True, False])
def test_tensor_parallel_ranks_apply_the_same_mask(path, reference, overlap):
    """Followers have no grammar state: rank 0's plan carries the mask, or their token pools (and
    so the next step's all-reduced activations) would disagree with rank 0's."""
    prompts, params, expected = reference
    picked = list(range(0, 24))
    extra = [sampling(1, regex=REGEXES[0], min_new_tokens=30)]  # no ban on a constrained row
    with LLM(str(path), device="cpu", dtype="float32", tp_size=2, page_size=4,
             max_prefill_tokens=32, overlap=overlap, tp_timeout_s=60.0) as llm:
        register_engine(llm.core)
        outs = llm.generate([prompts[i] for i in picked] + [prompt(1)],
                            [params[i] for i in picked] + extra)
    assert ids(outs[:-1]) == [expected[i] for i in picked]
    assert check_in_language(outs, [params[i] for i in picked] + extra) == 19


def test_eos_outside_the_vocabulary_is_not_a_stop_token(path, make_llm, tmp_path):
    """A config may list an EOS id past the vocabulary (the model can never sample it); xgrammar
    refuses such a stop token, so it is left out and the grammar still ends on the others."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(path, folder)
    gen = folder / "generation_config.json"
    config = json.loads(gen.read_text()) if gen.exists() else {}
    config["eos_token_id"] = [2, 10**6]
    gen.write_text(json.dumps(config))
    llm = make_llm(folder)
    assert 10**6 in llm.core.model_info.eos_token_ids
    out = llm.generate([prompt(1)], SamplingParams(regex="(yes|no)", max_new_tokens=8, seed=1))[0]
    assert out.text in ("yes", "no") and out.finish_reason == "eos"
    llm.close()


def test_mask_fill_time_is_counted_only_for_steps_with_a_mask(path, make_llm):
    llm = make_llm(path)
    llm.generate([prompt(0)], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert llm.stats()["grammar_mask_steps_total"] == llm.stats()["grammar_mask_us_total"] == 0
    out = llm.generate([prompt(1)], SamplingParams(regex="[a-c]{3,5}", max_new_tokens=16))[0]
    stats = llm.stats()
    # one mask per sampled step of the constrained request: its tokens and the stop token
    assert stats["grammar_mask_steps_total"] == len(out.token_ids)
    assert stats["grammar_mask_us_total"] > 0
