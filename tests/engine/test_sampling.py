"""Sampling and stopping behaviour through the offline API."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from radixserve.engine import InvalidRequestError, SamplingParams
from triton_interpreter import cpu_only, run_interpreted

PROMPTS = [[5, 17, 99, 203, 7], [300, 2, 41], [12, 12, 12, 800, 45, 46, 47, 48], [600, 601]]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from checkpoints import checkpoint

    return checkpoint("qwen3", tmp_path_factory)


def ids(outs):
    return [o.token_ids for o in outs]


def test_temperature_zero_and_top_k_one_are_greedy(path, make_llm):
    llm = make_llm(path)
    greedy = ids(llm.generate(PROMPTS,
                              SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)))
    top1 = ids(llm.generate(PROMPTS,
                            SamplingParams(temperature=0.8, top_k=1, max_new_tokens=12,
                                           ignore_eos=True)))
    assert greedy == top1


def test_seed_reproducible_whatever_the_batch(path, make_llm):
    llm = make_llm(path)
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, seed=1234,
                       max_new_tokens=16, ignore_eos=True)
    alone = llm.generate(PROMPTS[:1], p)[0].token_ids
    others = [SamplingParams(temperature=0.7, seed=s, max_new_tokens=9, ignore_eos=True)
              for s in range(5)]
    mixed = llm.generate(PROMPTS[1:] + PROMPTS[:1] + PROMPTS[1:2], others[:3] + [p] + others[3:4])
    assert mixed[3].token_ids == alone
    other_seed = llm.generate(PROMPTS[:1], dataclasses.replace(p, seed=99))[0].token_ids
    assert other_seed != alone  # the seed matters


def test_unseeded_sampling_varies(path, make_llm):
    llm = make_llm(path)
    p = SamplingParams(temperature=1.5, max_new_tokens=16, ignore_eos=True)
    outs = ids(llm.generate(PROMPTS[:1] * 4, p))
    assert len({tuple(o) for o in outs}) > 1


def test_penalties_change_the_output(path, make_llm):
    llm = make_llm(path)
    base = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    plain = ids(llm.generate(PROMPTS, base))
    for field, value in (("repetition_penalty", 1.8), ("frequency_penalty", 2.0),
                         ("presence_penalty", 2.0)):
        got = ids(llm.generate(PROMPTS, dataclasses.replace(base, **{field: value})))
        assert got != plain, field


def test_penalty_arithmetic():
    """repetition over prompt + output (divide positive, multiply negative); frequency / presence
    subtract per output occurrence / once, as transformers and OpenAI define them."""
    import torch
    from radixserve.engine.sampling.sampler import Penalties, Sampler

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    pool = torch.tensor([[0, 1, 3, 3, 2, 4, 4]])  # prompt = first 2 tokens; output: 3, 3, 2
    pen = Penalties(rows=torch.tensor([0]), slots=torch.tensor([0]), prompt_lens=torch.tensor([2]),
                    seq_lens=torch.tensor([5]), repetition=torch.tensor([[2.0]]),
                    frequency=torch.tensor([[0.5]]), presence=torch.tensor([[0.25]]))
    Sampler._apply_penalties(logits, pen, pool)
    expected = [2.0 / 2, -1.0 * 2, 0.5 / 2 - 0.5 - 0.25, 3.0 / 2 - 1.0 - 0.25, -2.0]
    assert logits[0].tolist() == pytest.approx(expected)


def test_each_stop_condition_reports_its_reason(path, make_llm):
    llm = make_llm(path)
    base = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    ref = llm.generate(PROMPTS[:1], base)[0]
    assert ref.finish_reason == "length" and len(ref.token_ids) == 10

    stop_tok = ref.token_ids[3]
    first = ref.token_ids.index(stop_tok)
    out = llm.generate(PROMPTS[:1], dataclasses.replace(base, stop_token_ids=(stop_tok,)))[0]
    assert out.finish_reason == "stop_token" and out.token_ids == ref.token_ids[: first + 1]
    assert out.matched_stop == stop_tok

    held = llm.generate(PROMPTS[:1],
                        dataclasses.replace(base, stop_token_ids=(stop_tok,),
                                            min_new_tokens=first + 2))[0]
    assert stop_tok not in held.token_ids[: first + 2]  # banned until min_new_tokens are out

    llm.core.model_info = dataclasses.replace(llm.core.model_info, eos_token_ids=(stop_tok,))
    out = llm.generate(PROMPTS[:1], dataclasses.replace(base, ignore_eos=False))[0]
    assert out.finish_reason == "eos" and out.token_ids[-1] == stop_tok

    text = ref.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"need a visible stop string in {text!r}"
    out = llm.generate(PROMPTS[:1], dataclasses.replace(base, stop=(stop,)))[0]
    assert out.finish_reason == "stop_string" and out.matched_stop == stop
    assert out.text == text[: text.index(stop)]
    kept = llm.generate(PROMPTS[:1],
                        dataclasses.replace(base, stop=(stop,), include_stop_str=True))[0]
    assert kept.text == text[: text.index(stop) + len(stop)]


def test_offline_text_is_decoded_through_the_byte_table(path, make_llm, monkeypatch):
    """`LLM` builds its tokenizer's byte table once and every request's detokenizer decodes
    through it; the text is the tokenizer's decode of the ids."""
    from radixserve.engine import detokenize
    from radixserve.engine.byte_table import ByteTable

    given = []

    class Recording(detokenize.IncrementalDetokenizer):
        def __init__(self, tokenizer, *args, **kwargs) -> None:
            given.append(tokenizer)
            super().__init__(tokenizer, *args, **kwargs)

    monkeypatch.setattr(detokenize, "IncrementalDetokenizer", Recording)
    llm = make_llm(path)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=12,
                                                ignore_eos=True))
    assert len(given) == len(PROMPTS) and isinstance(given[0], ByteTable)
    assert all(t is given[0] for t in given)
    for out in outs:
        assert out.text == llm.tokenizer.decode(out.token_ids,
                                                skip_special_tokens=True).rstrip("\ufffd")


def test_abort_reports_and_frees(path, make_llm):
    llm = make_llm(path, max_prefill_tokens=16)
    core = llm.core
    p = SamplingParams(temperature=0, max_new_tokens=50, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS * 3):
        core.add_request(f"r{i}", prompt * 8, p)
    for step in range(6):  # abort at different phases: queued, mid-prefill, decoding
        core.step()
        assert core.abort(f"r{step * 2}")
        assert not core.abort(f"r{step * 2}")  # idempotent
    while core.has_work():
        core.step()
    assert not core.abort("unknown")


@pytest.mark.parametrize("overlap", [True, False])
def test_abort_once_a_step_is_launched_keeps_the_others_exact(path, make_llm, overlap):
    """`EngineCore.step(launched_hook)`: the serving loop applies aborts there, while the device
    computes the step just launched (and, with overlap, the one before it). The requests left get
    the tokens of a run without the aborts, and every page comes back (pool invariant fixture)."""
    p = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    prompts = [prompt * 4 for prompt in PROMPTS * 2]
    # Pages of one token: whatever KV an aborted request has goes to the prefix cache, keyed by
    # its token ids, including KV computed for a token the host has not yet seen.
    config = {"max_prefill_tokens": 16, "overlap": overlap, "page_size": 1}
    ref = [o.token_ids for o in make_llm(path, **config).generate(prompts, p)]
    core = make_llm(path, **config).core
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, p)
    doomed_ids = ("r0", "r3", "r5", "r6")  # mid-prefill, then in decode with steps in flight
    doomed = iter(doomed_ids)
    tokens: dict[str, list[int]] = {}
    aborted = []
    step = 0
    while core.has_work():
        step += 1
        hook = (lambda: aborted.append(core.abort(next(doomed)))) if step in (2, 12, 13, 16) \
            else None
        for out in core.step(hook):
            tokens.setdefault(out.rid, []).extend(out.token_ids)
    assert aborted == [True] * 4
    for i, want in enumerate(ref):
        if f"r{i}" not in doomed_ids:
            assert tokens[f"r{i}"] == want, f"r{i}"


def test_logprobs_are_returned(path, make_llm):
    llm = make_llm(path)
    out = llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_new_tokens=5, top_logprobs=3))
    for o in out:
        assert len(o.logprobs) == len(o.token_ids)
        for tok, lp in zip(o.token_ids, o.logprobs):
            # greedy = top-1
            assert lp.top[0][0] == tok and lp.logprob == pytest.approx(lp.top[0][1])


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"min_p": 2}, "min_p"), ({"min_p": -0.1}, "min_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"stop": ("",)}, "stop"), ({"stop": tuple("abcdefghijklmnopq")}, "stop"),
    ({"stop": ("x" * 300,)}, "stop"), ({"top_logprobs": 21}, "top_logprobs"),
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
    ({"regex": ""}, "regex"), ({"ebnf": "  "}, "ebnf"), ({"json_schema": 5}, "json_schema"),
    ({"regex": "a", "ebnf": 'root ::= "a"'}, "regex and ebnf"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**kwargs)


def test_constraint_fields():
    from radixserve.engine.sampling.params import MAX_CONSTRAINT_CHARS

    assert SamplingParams().constraint is None
    assert SamplingParams(regex="a+").constraint == ("regex", "a+")
    assert SamplingParams(ebnf='root ::= "a"').constraint == ("ebnf", 'root ::= "a"')
    p = SamplingParams(json_schema={"type": "string"})
    assert p.constraint == ("json_schema", '{"type": "string"}') and hash(p)
    SamplingParams(regex="a" * MAX_CONSTRAINT_CHARS)
    n = MAX_CONSTRAINT_CHARS + 1
    with pytest.raises(InvalidRequestError, match=f"json_schema is {n} .* {MAX_CONSTRAINT_CHARS}"):
        SamplingParams(json_schema="x" * n)


def test_bad_requests_are_rejected_before_running(path, make_llm):
    llm = make_llm(path, num_pages=8, page_size=16)  # 128 tokens of KV in all
    core, ctx = llm.core, llm.core.model_info.max_context
    p = SamplingParams(max_new_tokens=4)
    with pytest.raises(InvalidRequestError, match="empty"):
        core.add_request("a", [], p)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        core.add_request("a", [1, core.model_info.vocab_size], p)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        core.add_request("a", [-1], p)
    with pytest.raises(InvalidRequestError, match=f"context is {ctx}"):
        core.add_request("a", [1] * ctx, p)
    with pytest.raises(InvalidRequestError,
                       match=f"10 tokens in prompt, {ctx} requested, limit {ctx}"):
        core.add_request("a", [1] * 10, SamplingParams(max_new_tokens=ctx))
    with pytest.raises(InvalidRequestError, match="whole pool"):
        core.add_request("a", [1] * 100, SamplingParams(max_new_tokens=100))
    core.add_request("a", [1, 2], p)
    with pytest.raises(InvalidRequestError, match="already running"):
        core.add_request("a", [1, 2], p)
    while core.has_work():
        core.step()


def test_kv_pressure_finishes_everything_with_same_outputs(path, make_llm):
    prompts = [[(i * 37 + j) % 900 + 3 for j in range(20 + i)] for i in range(12)]
    p = SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)
    roomy = ids(make_llm(path).generate(prompts, p))
    tight = make_llm(path, num_pages=16, page_size=4)  # room for about one request at a time
    assert ids(tight.generate(prompts, p)) == roomy


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_seeded_draw_follows_the_tempered_distribution(device):
    """20k independent keys on one row of logits: frequencies match softmax(logits / T), greedy rows
    take the argmax, and banned (-inf) tokens never come out."""
    from radixserve.engine.sampling.race import mix32, race

    S, T = 20000, 0.7
    logits = torch.tensor([[1.0, 0.5, 2.0, -1.0, float("-inf"), 0.0, 1.5, -0.5]],
                          device=device).repeat(S, 1)
    key = mix32(torch.arange(S, dtype=torch.int64, device=device) * 7919 + 13)
    greedy = torch.zeros(S, dtype=torch.bool, device=device)
    greedy[:100] = True
    tokens = race(logits, torch.full((S, 1), T, device=device), key, greedy).cpu()
    assert (tokens[:100] == 2).all()
    freq = torch.bincount(tokens[100:], minlength=8).double() / (S - 100)
    want = torch.softmax(logits[0].double().cpu() / T, dim=0)
    assert freq[4] == 0 and (freq - want).abs().max() < 0.015, (freq, want)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_noise_that_rounds_to_one_never_lets_a_banned_token_win(device):
    """Key 10664 hashes token 875 to 4294967244, which is 1.0 in float32: its Gumbel noise was
    +inf, a banned (-inf) logit plus it was NaN, and argmax took the NaN (a constrained row then
    sampled a token its grammar forbids)."""
    from radixserve.engine.sampling.race import _token_hash, _uniform, mix32, race

    key = torch.tensor([10664], dtype=torch.int64, device=device)
    assert int(mix32(key[:, None] ^ _token_hash(1024, key.device)[None, :])[0, 875]) == 4294967244
    assert _uniform(torch.tensor([0, 2**32 - 1])).tolist() == [pytest.approx(2**-33), 1 - 2**-24]
    logits = torch.zeros(1, 1024, device=device)
    logits[0, 875] = float("-inf")
    greedy = torch.zeros(1, dtype=torch.bool, device=device)
    assert int(race(logits, torch.ones(1, 1, device=device), key, greedy)) != 875
    logits[0, 875] = 0.0  # allowed, it wins by a large but finite margin
    assert int(race(logits, torch.ones(1, 1, device=device), key, greedy)) == 875


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_race_kernel_matches_the_torch_draw():
    from radixserve.engine.sampling.race import mix32, race, race_torch

    S, V = 64, 151936
    logits = torch.randn(S, V, device="cuda") * 3
    logits[:, 1000:2000] = float("-inf")
    temp = torch.rand(S, 1, device="cuda") + 0.2
    key = mix32(torch.arange(S, dtype=torch.int64, device="cuda") + 5)
    greedy = torch.arange(S, device="cuda") % 5 == 0
    got, want = race(logits, temp, key, greedy), race_torch(logits, temp, key, greedy)
    assert (got[greedy] == want[greedy]).all()
    assert (got == want).float().mean() > 0.98  # log() differs in the last bit between the two


def _race_cases(device: str):
    """(logits, temperature, seeds, greedy) at shapes that split rows over 1 to 75 parts; bf16
    logits, seeds whose salted high half carries past 2^32."""
    from radixserve.engine.sampling.race import RowSeeds

    g = torch.Generator().manual_seed(0)
    for S, V in [(1, 151936), (7, 4097), (64, 9000), (300, 5000)]:
        logits = (torch.randn(S, V, generator=g) * 3).to(torch.bfloat16)
        logits[:, 100:300] = float("-inf")
        logits[S // 2, :] = float("-inf")  # a row with nothing allowed takes column 0, as argmax
        seeds = RowSeeds(torch.randint(0, 2**32, (S,), generator=g),
                         torch.randint(2**32 - 2**31, 2**32, (S,), generator=g),
                         torch.randint(0, 5000, (S,), generator=g))
        yield (logits.to(device), (torch.rand(S, 1, generator=g) + 0.2).to(device),
               RowSeeds(*(t.to(device) for t in seeds)), (torch.arange(S) % 3 == 0).to(device))


_INTERPRETED_RACE = """
import torch
import radixserve.engine.sampling.race as race
from tests.engine.test_sampling import _race_cases
race._num_sms = lambda device: 132  # an H200's SMs: rows split into up to 75 parts
for logits, temp, seeds, greedy in _race_cases("cpu"):
    want = race.race_torch(logits, temp, race.row_keys(seeds), greedy)
    derived = race._launch(logits, temp, greedy, None, seeds)
    keyed = race._launch(logits, temp, greedy, race.row_keys(seeds), None)
    assert torch.equal(derived, want) and torch.equal(keyed, want), (logits.shape, derived, want)
    # the ids also into a token pool, at each row's slot and position, and nowhere else
    S = logits.size(0)
    pool = torch.full((S + 3, 40), -1, dtype=torch.int64)
    slots, positions = torch.randperm(S + 3)[:S], torch.randint(0, 40, (S,))
    into = race.PoolWrite(pool, slots, positions)
    assert torch.equal(race._launch(logits, temp, greedy, None, seeds, into), want)
    assert torch.equal(pool[slots, positions], want) and int((pool != -1).sum()) == S
    print(tuple(logits.shape), race._parts(*logits.shape, None))
"""


@cpu_only
def test_race_kernel_in_the_triton_interpreter():
    """The Triton draw, run on the CPU by Triton's interpreter: the split over parts, the pick
    among them and the keys derived in the kernel give the torch draw's tokens exactly."""
    out = run_interpreted(_INTERPRETED_RACE)
    assert "(1, 151936) (75, 1)" in out, out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_race_kernel_derives_keys_and_splits_rows_on_the_gpu():
    from radixserve.engine.sampling.race import PoolWrite, race_seeded, race_torch, row_keys

    for logits, temp, seeds, greedy in _race_cases("cuda"):
        S = logits.size(0)
        pool = torch.full((S + 3, 40), -1, dtype=torch.int64, device="cuda")
        slots = torch.randperm(S + 3, device="cuda")[:S]
        positions = torch.randint(0, 40, (S,), device="cuda")
        got = race_seeded(logits, temp, seeds, greedy, PoolWrite(pool, slots, positions))
        want = race_torch(logits, temp, row_keys(seeds), greedy)
        assert torch.equal(got[greedy], want[greedy])
        assert (got == want).float().mean() > 0.98  # log() differs in the last bit between the two
        assert torch.equal(pool[slots, positions], got) and int((pool != -1).sum()) == S


def test_the_torch_draw_writes_its_ids_into_the_pool_too():
    """On a CPU (no Triton kernel) the seeded draw writes the pool itself, as the kernel does."""
    from radixserve.engine.sampling.race import PoolWrite, race_seeded, race_torch, row_keys

    logits, temp, seeds, greedy = next(iter(_race_cases("cpu")))
    pool = torch.full((4, 8), -1, dtype=torch.int64)
    got = race_seeded(logits, temp, seeds, greedy,
                      PoolWrite(pool, torch.tensor([2]), torch.tensor([5])))
    assert torch.equal(got, race_torch(logits, temp, row_keys(seeds), greedy))
    assert int(pool[2, 5]) == int(got[0]) and int((pool != -1).sum()) == 1
