"""`admission_wait_ms`: while requests decode, arrivals are held back to be admitted together (fewer
steps that carry prefill), but never past the wait, and at once when waiting longer adds nothing.
`mixed_prefill_tokens`: while requests decode, a step takes at most that many prompt tokens."""

from __future__ import annotations

import pytest
from radixserve.engine import SamplingParams
from radixserve.engine.request import ReqStatus

GREEDY = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
LONG = 60_000.0  # ms: longer than any test runs, so only the other rules can admit


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from checkpoints import checkpoint

    return checkpoint("qwen3", tmp_path_factory)


def _prompt(i: int) -> list[int]:
    return [(i * 31 + j * 7) % 500 + 3 for j in range(6 + i)]


def _waiting(core, rid: str) -> bool:
    return any(r.rid == rid and r.status is ReqStatus.WAITING for r in core.scheduler.waiting)


def test_an_arrival_waits_while_others_decode_until_its_time_is_up(path, make_llm):
    core = make_llm(path, admission_wait_ms=LONG, max_running_requests=4).core
    core.add_request("first", _prompt(0), GREEDY)
    core.step()  # an idle engine admits at once
    assert not _waiting(core, "first")
    core.add_request("late", _prompt(1), GREEDY)
    for _ in range(3):
        core.step()
        assert _waiting(core, "late")
    core.scheduler.waiting[0].queued_at -= LONG / 1000  # its wait is over
    core.step()
    assert not _waiting(core, "late")
    while core.has_work():
        core.step()


def test_a_lightly_loaded_engine_admits_at_once(path, make_llm):
    """One request decoding in 8 slots: the engine has room, so an arrival does not wait."""
    core = make_llm(path, admission_wait_ms=LONG, max_running_requests=8).core
    core.add_request("first", _prompt(0), GREEDY)
    core.step()
    core.add_request("next", _prompt(1), GREEDY)
    core.step()
    assert not _waiting(core, "next")
    while core.has_work():
        core.step()


def test_full_slots_do_not_end_the_wait(path, make_llm):
    """Running requests finish while arrivals wait, so a full set of slots is no reason to stop."""
    core = make_llm(path, admission_wait_ms=LONG, max_running_requests=2).core
    core.add_request("first", _prompt(0), GREEDY)
    core.step()
    core.add_request("a", _prompt(1), GREEDY)
    core.step()
    assert _waiting(core, "a")
    while core.has_work():
        core.step()  # admitted once "first" is done and the engine would otherwise idle


def test_arrivals_that_fill_the_prefill_budget_are_admitted_at_once(path, make_llm):
    core = make_llm(path, admission_wait_ms=LONG, max_prefill_tokens=16, page_size=4,
                    max_running_requests=4).core
    core.add_request("first", _prompt(0), GREEDY)
    core.step()
    core.add_request("small", _prompt(0), GREEDY)  # 6 tokens of a 16-token budget
    core.step()
    assert _waiting(core, "small")
    core.add_request("big", _prompt(12), GREEDY)  # 18 more: the budget is full
    core.step()
    assert not _waiting(core, "small")
    while core.has_work():
        core.step()


def test_a_queue_beyond_the_free_slots_still_waits(path, make_llm):
    """Only what the free slots can take counts toward the budget: a long queue behind one free
    slot waits, so an offline queue of thousands enters in groups too."""
    core = make_llm(path, admission_wait_ms=LONG, max_prefill_tokens=16, page_size=4,
                    max_running_requests=4).core
    for i in range(3):
        core.add_request(f"run{i}", _prompt(0), GREEDY)
    core.step()
    core.add_request("a", _prompt(0), GREEDY)  # 6 tokens fit the one free slot
    core.add_request("b", _prompt(12), GREEDY)  # 18 more, but no slot for them yet
    core.step()
    assert _waiting(core, "a") and _waiting(core, "b")
    while core.has_work():
        core.step()


def test_held_arrivals_get_the_same_tokens(path, make_llm):
    """Outputs do not depend on when a request is admitted (greedy, and seeded sampling)."""
    prompts = [_prompt(i) for i in range(6)]
    seeded = SamplingParams(temperature=0.8, seed=5, max_new_tokens=12, ignore_eos=True)
    params = [GREEDY, seeded] * 3
    outs = {}
    for wait in (0.0, LONG):
        core = make_llm(path, admission_wait_ms=wait, max_running_requests=4).core
        core.add_request("r0", prompts[0], params[0])
        got: dict[str, list[int]] = {}
        step = 0
        while core.has_work() or step < len(prompts):
            if 0 < step < len(prompts):  # one arrival per step while r0 decodes
                core.add_request(f"r{step}", prompts[step], params[step])
            if step == 3 and wait:
                for req in core.scheduler.waiting:
                    req.queued_at -= LONG / 1000
            for out in core.step() if core.has_work() else []:
                got.setdefault(out.rid, []).extend(out.token_ids)
            step += 1
        outs[wait] = got
    assert outs[0.0] == outs[LONG]
    assert all(len(v) == 12 for v in outs[LONG].values()) and len(outs[LONG]) == len(prompts)


def test_admission_wait_is_validated(path):
    from radixserve.engine.config import EngineConfig

    with pytest.raises(ValueError, match="admission_wait_ms"):
        EngineConfig(model_path=str(path), admission_wait_ms=-1.0)


def test_the_default_wait_holds_arrivals_only_where_prefill_steps_run_eagerly(path, make_llm):
    """Unset, the wait is EAGER_PREFILL_ADMISSION_WAIT_MS where steps with prefill tokens run
    eagerly (here: CPU) and 0 where piecewise graphs run them (here: the pieces, uncaptured)."""
    from radixserve.engine.config import EAGER_PREFILL_ADMISSION_WAIT_MS

    eager = make_llm(path, max_running_requests=4).core
    assert eager.runner.pieces is None
    assert eager.config.admission_wait_ms == EAGER_PREFILL_ADMISSION_WAIT_MS > 0
    pieces = make_llm(path, max_running_requests=4, piecewise_graph_max_tokens=64).core
    assert pieces.runner.pieces is not None and pieces.config.admission_wait_ms == 0
    assert make_llm(path, admission_wait_ms=7.0).core.config.admission_wait_ms == 7.0



def _run_with_an_arrival(core) -> tuple[list[tuple[int, int]], dict[str, list[int]]]:
    """"first" alone, then "late" once "first" decodes: each step's (decoding rows, prompt tokens)
    and each request's output ids."""
    steps, schedule = [], core.scheduler.schedule

    def spy():
        batch = schedule()
        if batch is not None:
            decoding = sum(p >= r.prompt_len for r, p in zip(batch.reqs, batch.prefix_lens))
            steps.append((decoding, batch.num_tokens - decoding))
        return batch

    core.scheduler.schedule = spy
    outputs: dict[str, list[int]] = {"first": [], "late": []}
    core.add_request("first", [(j * 7) % 500 + 3 for j in range(40)], GREEDY)
    for out in core.step():
        outputs[out.rid] += out.token_ids
    core.add_request("late", [(j * 11) % 500 + 3 for j in range(40)], GREEDY)
    while core.has_work():
        for out in core.step():
            outputs[out.rid] += out.token_ids
    return steps, outputs


def test_a_step_that_decodes_takes_the_mixed_prefill_budget(path, make_llm):
    """A prompt that arrives while another request decodes is chunked to mixed_prefill_tokens a
    step; one that finds nobody decoding takes max_prefill_tokens. The outputs stay the same."""
    steps, outputs = _run_with_an_arrival(make_llm(
        path, max_prefill_tokens=64, mixed_prefill_tokens=8, page_size=4,
        max_running_requests=4).core)
    assert steps[0] == (0, 40)  # nobody decoding: the whole prompt in one step
    assert [prefill for decoding, prefill in steps[1:] if prefill] == [8] * 5
    assert all(decoding == 1 for decoding, prefill in steps[1:6])  # beside "first"'s decode rows
    _, unbounded = _run_with_an_arrival(make_llm(path, max_prefill_tokens=64, page_size=4,
                                                 max_running_requests=4).core)
    assert outputs == unbounded and len(outputs["late"]) == GREEDY.max_new_tokens


def test_mixed_prefill_tokens_must_be_positive():
    from radixserve.engine.config import EngineConfig

    with pytest.raises(ValueError, match="mixed_prefill_tokens"):
        EngineConfig(model_path="m", mixed_prefill_tokens=0)
