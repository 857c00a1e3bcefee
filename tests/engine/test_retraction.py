"""Optimistic admission under KV pressure: retraction and resumption must not change any output."""

from __future__ import annotations

import pytest
from radixserve.engine import SamplingParams
from radixserve.engine.request import ReqStatus

MAX_NEW = 24


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from checkpoints import checkpoint

    return checkpoint("qwen3", tmp_path_factory)


def make_prompts(n: int) -> list[list[int]]:
    # Varied lengths (8..31) and a few shared prefixes, so the radix cache has something to reuse.
    return [([11, 12, 13, 14] if i % 3 == 0 else [])
            + [(i * 37 + j * 11) % 900 + 3 for j in range(8 + i % 24)]
            for i in range(n)]


def demand_pages(prompts: list[list[int]], max_new: int, page_size: int) -> int:
    return sum(-(-(len(p) + max_new) // page_size) for p in prompts)


def ids(outs):
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def greedy_reference(path, tmp_path_factory):
    """Unpressured greedy outputs of 32 prompts (page size does not change them)."""
    from radixserve.engine import LLM

    llm = LLM(str(path), device="cpu", dtype="float32")
    prompts = make_prompts(32)
    return prompts, ids(llm.generate(prompts,
                                     SamplingParams(temperature=0, max_new_tokens=MAX_NEW,
                                                    ignore_eos=True)))


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("cache", ["radix", "naive"])
def test_pressure_keeps_greedy_outputs(path, make_llm, greedy_reference, overlap, page_size, cache):
    prompts, expected = greedy_reference
    p = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, ignore_eos=True)
    num_pages = int(0.3 * demand_pages(prompts, MAX_NEW, page_size))
    for admission in ("optimistic", "reserve"):
        llm = make_llm(path, num_pages=num_pages, page_size=page_size, cache=cache, overlap=overlap,
                       admission=admission)
        in_flight = watch_retractions(llm.core.scheduler)
        sums = watch_reservations(llm.core.scheduler)
        assert ids(llm.generate(prompts, p)) == expected, admission
        assert sums and all(sums), "the reservations a step keeps must equal their sum"
        retractions = llm.core.stats()["retractions_total"]
        if admission == "optimistic":
            assert retractions > 0
            # With overlap, a retracted request has a sampled token in flight: the tricky case.
            assert any(in_flight) == overlap
        else:
            assert retractions == 0


def watch_reservations(scheduler) -> list[bool]:
    """Per admission: whether the reservation total the step keeps (summed once, then one
    admission at a time) equals the running requests' reservations summed afresh."""
    checks: list[bool] = []
    admit = scheduler._admit

    def wrapped(req, reserved):
        checks.append(reserved == scheduler.reserved_pages())
        return admit(req, reserved)

    scheduler._admit = wrapped
    return checks


def watch_retractions(scheduler) -> list[int]:
    """Record, per retraction, how many sampled tokens the host had not seen yet."""
    pending: list[int] = []
    retract = scheduler._retract

    def wrapped(req):
        pending.append(req.num_scheduled_outputs - len(req.output_ids))
        retract(req)

    scheduler._retract = wrapped
    return pending


@pytest.mark.parametrize("overlap", [True, False])
def test_pressure_with_chunked_prefill(path, make_llm, greedy_reference, overlap):
    """Small prefill chunks: requests are retracted mid-prompt and resumed with shorter chunks."""
    prompts, expected = greedy_reference
    p = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, ignore_eos=True)
    llm = make_llm(path, num_pages=int(0.3 * demand_pages(prompts, MAX_NEW, 4)), page_size=4,
                   max_prefill_tokens=16, overlap=overlap, admission="optimistic")
    assert ids(llm.generate(prompts, p)) == expected
    assert llm.core.stats()["retractions_total"] > 0


@pytest.mark.parametrize("overlap", [True, False])
def test_pressure_keeps_seeded_samples(path, make_llm, overlap):
    prompts = make_prompts(24)
    params = [SamplingParams(temperature=1.0, top_p=0.95, top_k=40, seed=100 + i,
                             max_new_tokens=MAX_NEW,
                             ignore_eos=True, repetition_penalty=1.1 if i % 2 else 1.0,
                             min_new_tokens=4)
              for i in range(len(prompts))]
    roomy = ids(make_llm(path, overlap=overlap).generate(prompts, params))
    tight = make_llm(path, num_pages=int(0.3 * demand_pages(prompts, MAX_NEW, 4)), page_size=4,
                     overlap=overlap, admission="optimistic")
    assert ids(tight.generate(prompts, params)) == roomy
    assert tight.core.stats()["retractions_total"] > 0


@pytest.mark.parametrize("overlap", [True, False])
def test_abort_of_a_retracted_request_frees_everything(path, make_llm, overlap):
    prompts = make_prompts(24)
    llm = make_llm(path, num_pages=int(0.3 * demand_pages(prompts, MAX_NEW, 4)), page_size=4,
                   overlap=overlap, admission="optimistic")
    core = llm.core
    p = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, p)
    aborted = None
    while core.has_work() and aborted is None:
        core.step()
        for req in core.scheduler.waiting:
            if req.output_ids and req.status is ReqStatus.WAITING:  # retracted, waiting again
                aborted = req
                break
    assert aborted is not None, "no request was retracted"
    assert core.abort(aborted.rid)
    assert aborted.finished and aborted.slot == -1
    assert aborted not in core.scheduler.waiting
    while core.has_work():
        core.step()
    # The pool invariant fixture checks pages, slots and locks once the test returns.


def test_admission_is_validated(path):
    from radixserve.engine.config import EngineConfig

    with pytest.raises(ValueError, match="admission"):
        EngineConfig(model_path=str(path), admission="eager")  # type: ignore[arg-type]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("cache", ["radix", "naive"])
def test_abort_while_retracted_and_while_readmitted(path, make_llm, greedy_reference, overlap,
                                                    cache):
    """docs/reliability.md #11: abort requests that sit in the queue after a retraction, and
    requests that are being admitted again (small prefill chunks: prompt + outputs take several
    steps to re-prefill; with the naive cache nothing of it is reused, so the re-prefill always
    spans several steps). Each abort frees the request at once, nothing is emitted for it
    afterwards, the others produce exactly the unpressured outputs, and the pool invariant holds."""
    prompts, expected = greedy_reference
    llm = make_llm(path, num_pages=int(0.3 * demand_pages(prompts, MAX_NEW, 4)), page_size=4,
                   max_prefill_tokens=16, overlap=overlap, admission="optimistic", cache=cache)
    core, sched = llm.core, llm.core.scheduler
    p = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, p)
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    aborted: dict[str, str] = {}  # rid -> phase
    seen: list[str] = []  # retracted requests, in the order they were first seen waiting

    def abort(req, phase: str) -> None:
        assert core.abort(req.rid)
        assert req.finished and req.slot == -1
        assert req not in sched.waiting and req not in sched.running
        assert not core.abort(req.rid)  # a second abort is a no-op, never a double free
        aborted[req.rid] = phase

    while core.has_work():
        for out in core.step():
            assert out.rid not in aborted, f"{out.rid} emitted after its abort"
            got[out.rid].extend(out.token_ids)
        phases = list(aborted.values())
        # Every other retracted request is aborted in the queue; the rest are left to come back.
        for req in [r for r in sched.waiting if r.output_ids and r.rid not in seen]:
            seen.append(req.rid)
            if len(seen) % 2 == 1 and phases.count("retracted") < 3:
                abort(req, "retracted")
        readmitting = [r for r in sched.running if r.output_ids and not r.prefill_done]
        if readmitting and phases.count("readmitting") < 3:
            abort(readmitting[-1], "readmitting")

    phases = list(aborted.values())
    assert "retracted" in phases, aborted
    if cache == "naive":
        assert "readmitting" in phases, aborted
    for i in range(len(prompts)):
        if f"r{i}" not in aborted:
            assert got[f"r{i}"] == expected[i], f"r{i}"
    assert sched.retractions_total > 0
    core.check_integrity()
